"""The model layer: ResNet architectures, their blocks and presets; no training logic."""
