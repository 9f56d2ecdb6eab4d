"""``gaca-view``: a local web app over run and evaluation folders (see :mod:`.app`)."""
