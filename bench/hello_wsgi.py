"""The HTTP baseline: the smallest WSGI app, under the same gunicorn, sync workers and access log.

It reads the request body and answers a fixed JSON document, so the bench can
tell what gunicorn and the kernel cost on this machine from what Django, DRF
and the database add on top.
"""

BODY = b'{"eval_id": "00000000-0000-0000-0000-000000000000", "status": "pending"}'


def app(environ, start_response):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        environ["wsgi.input"].read(length)
    status = "202 Accepted" if environ["REQUEST_METHOD"] == "POST" else "200 OK"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))])
    return [BODY]
