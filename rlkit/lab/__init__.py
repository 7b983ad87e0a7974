"""The reproduction app, beside the library: specs → runs → executed notebooks → claims → the book.

:mod:`~rlkit.lab.paths` (the project), :mod:`~rlkit.lab.specs`, :mod:`~rlkit.lab.reproduce` (runs, papermill),
:mod:`~rlkit.lab.claims` (rules, verdicts), :mod:`~rlkit.lab.stats`, :mod:`~rlkit.lab.judge`
(``claims.json``), :mod:`~rlkit.lab.findings`, :mod:`~rlkit.lab.report`, :mod:`~rlkit.lab.reproduced` (did I
reproduce?), :mod:`~rlkit.lab.runs` (the run files), :mod:`~rlkit.lab.notebook`, :mod:`~rlkit.lab.plots`,
:mod:`~rlkit.lab.book`, :mod:`~rlkit.lab.book_pages` and :mod:`~rlkit.lab.two_engines`. The library
(:mod:`rlkit.core`, :mod:`rlkit.methods`, :mod:`rlkit.registry`, :mod:`rlkit.tiny`, :mod:`rlkit.verl`) imports
nothing from here."""
