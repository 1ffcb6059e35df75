"""Ingest API views (filled in by the ingest module)."""
def ingest_json(request):  # placeholder until the writer lands
    raise NotImplementedError


def ingest_prometheus(request):
    raise NotImplementedError
