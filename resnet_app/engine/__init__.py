"""The training layer: a run's setup, the controller and its actions, the step, optimizers."""
