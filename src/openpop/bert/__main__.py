import sys

from .train import main

if __name__ == "__main__":
    sys.exit(main())
