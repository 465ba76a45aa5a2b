"""The tools of `resnet-app`: LR range test, schedule dry run, curves, a batch picture."""
