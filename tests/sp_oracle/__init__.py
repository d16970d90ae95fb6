"""The pure-Python twin of the compiled single-player core (``mortal.features.sp._core``), kept as a test oracle:
``shanten`` (``calc_all_py``), ``agari`` (``agari``, ``search_yakus``) and ``search`` (``calc``). The project runs the
core only; these are what the core is compared against."""
