"""One pool as its owner decides it during one epoch (``pool.OwnedPool``), the tables it keeps
(``tables``: grants held, phantoms, settled ids, sessions; ``answers``, ``bounds``), how it
takes a holder's re-report (``rereports``), and how its state is written (``writer``,
``commit``, ``journal``, ``poolstate``) and read back (``snapshot``)."""
