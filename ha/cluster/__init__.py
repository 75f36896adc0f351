"""The replicas together: this node's lease (``lease``), what it knows of the others
(``view``), which pools it owns (``ownership``), how it gives one up (``handover``) and
when it may try again (``backoff``)."""
