import sys

from nextok.cli import main

sys.exit(main())
