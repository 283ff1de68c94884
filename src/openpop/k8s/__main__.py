import sys

from openpop.k8s.cli import main

sys.exit(main())
