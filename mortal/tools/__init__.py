"""Tools at the top of ``mortal/``: doctor, bootstrap, quickstart, fleet (``python -m mortal.tools.<name>``)."""
