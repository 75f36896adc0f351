"""One pool as its owner decides it during one epoch (``pool.OwnedPool``) and the tables it
keeps: grants held, phantoms, settled ids, sessions, answers, bounds; and how its state is
written (``commit``, ``journal``, ``poolstate``) and read back (``snapshot``)."""
