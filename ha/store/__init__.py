"""The store a replica persists to and coordinates through: the contract (``contract``),
its key layout (``keys``), its implementations (``memory``, ``file``, ``etcd``), which of
them a node opens (``opening``) and the one place a full store is noticed (``writes``).
Nothing here knows pools or owners."""
