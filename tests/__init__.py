"""resnet_app tests; a package so that tests can share `reference.py`."""
