"""`python -m resnet_app COMMAND`: the same front door as `resnet-app COMMAND`."""

from resnet_app import commands

if __name__ == "__main__":
    commands.main()
