"""resnet_app: ResNet image-classification training on TensorFlow 2."""

__version__ = "0.1.0"
