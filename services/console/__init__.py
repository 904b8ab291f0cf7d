"""The web console: server-rendered pages over the nameservers' and brokers' APIs."""
