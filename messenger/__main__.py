import sys

from messenger.cli import main

sys.exit(main())
