"""``python -m multipos.report …``: see :func:`multipos.report.cli.main`."""

import sys

from multipos.report.cli import main

if __name__ == "__main__":
    main(sys.argv[1:])
