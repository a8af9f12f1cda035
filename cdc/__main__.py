import sys

from cdc.cli.main import main

sys.exit(main())
