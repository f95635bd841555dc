import sys

from pipecast.cli.main import main

sys.exit(main())
