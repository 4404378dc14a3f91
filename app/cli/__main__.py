import sys

from specgen.app.cli import main

sys.exit(main())
