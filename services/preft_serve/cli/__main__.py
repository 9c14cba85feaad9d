"""``python -m preft_serve.cli``: the ``preft`` command."""

from preft_serve.cli import main

raise SystemExit(main())
