"""The store a replica persists to and coordinates through: the contract (``contract``),
its key layout (``keys``), its implementations (``memory``, ``file``, ``etcd``) and the
one place a full store is noticed (``writes``). Nothing here knows pools or owners."""
