"""`resnet-app sweep`: searching training settings with Optuna, each trial a training run.

`space`: the searched keys; `study`: the Optuna study; `trial_run`: one trial's process;
`runner`: the checks and the loop; `report`: the ranking, plot and best recipe.
"""
