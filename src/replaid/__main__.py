import sys

from replaid.cli import main

sys.exit(main())
