import sys

from vmapbench.cli import main

sys.exit(main())
