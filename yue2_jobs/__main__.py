import sys

from yue2_jobs.cli import main

sys.exit(main())
