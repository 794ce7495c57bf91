import sys

from vispe.sweep.cli import main

sys.exit(main())
