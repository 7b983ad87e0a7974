"""The reproduction app, beside the library: specs → runs → executed notebooks → claims → the book.

- :mod:`rlkit.lab.paths` — where the project (``reproductions/``, ``notebooks/``, ``book/``) is: the one place;
- :mod:`rlkit.lab.reproduce` — specs, runs and papermill (``rlkit reproduce``);
- :mod:`rlkit.lab.claims` — the claim rules and verdicts; :mod:`rlkit.lab.stats` — their statistics;
  :mod:`rlkit.lab.judge` — claims judged from the runs (``claims.json``); :mod:`rlkit.lab.findings` — what was
  found, in words; :mod:`rlkit.lab.report` — the claims on the pages; :mod:`rlkit.lab.reproduced` — did I
  reproduce?;
- :mod:`rlkit.lab.runs` — the run files as the lab reads them (metrics, config, which seeds finished);
- :mod:`rlkit.lab.notebook` — what the notebooks share; :mod:`rlkit.lab.plots` — curves and captions
  (``rlkit plot``); :mod:`rlkit.lab.display` — the order and colour of the methods on the pages;
- :mod:`rlkit.lab.book` — the Jupyter Book (``rlkit book``); :mod:`rlkit.lab.book_pages` — the generated blocks
  of its *Full-scale runs* page; :mod:`rlkit.lab.two_engines` — a tiny run beside its verl twin.

The library (:mod:`rlkit.core`, :mod:`rlkit.methods`, :mod:`rlkit.registry`, :mod:`rlkit.tiny`, :mod:`rlkit.verl`)
imports nothing from here.
"""
