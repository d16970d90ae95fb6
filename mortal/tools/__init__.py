"""Tools around Mortal's processes, which stand at the top of ``mortal/``: ``doctor`` (pre-flight checks),
``bootstrap`` (a first model without Mortal's weights), ``quickstart`` (the whole pipeline on a small model, with
its config in ``quickstart_config``) and ``fleet`` (self-play clients as Ray actors). Each runs as
``python -m mortal.tools.<name>`` or as its ``mortal-<name>`` console command."""
