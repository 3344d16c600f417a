import sys

from messenger.tools.cli import main

sys.exit(main())
