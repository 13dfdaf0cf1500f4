# Minimal Glance v2 stub: enough for nova-api/compute to "see" one image.
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
IMG = "11111111-2222-3333-4444-555555555555"
image = {"id": IMG, "name": "fake", "status": "active", "visibility": "public", "protected": False,
         "container_format": "bare", "disk_format": "raw", "min_disk": 0, "min_ram": 0, "size": 1024,
         "virtual_size": None, "checksum": None, "owner": None, "tags": [], "os_hidden": False,
         "created_at": "2024-01-01T00:00:00Z", "updated_at": "2024-01-01T00:00:00Z",
         "self": "/v2/images/" + IMG, "file": "/v2/images/%s/file" % IMG, "schema": "/v2/schemas/image"}
class H(BaseHTTPRequestHandler):
    def _send(self, code, body):
        b = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        p = self.path.split("?")[0].rstrip("/")
        if p in ("", "/versions"):
            return self._send(200, {"versions": [{"id": "v2.9", "status": "CURRENT", "links": [{"rel": "self", "href": "http://127.0.0.1:%d/v2/" % PORT}]}]})
        if p == "/v2/images/" + IMG: return self._send(200, image)
        if p == "/v2/images": return self._send(200, {"images": [image]})
        if p.startswith("/v2/schemas/image"): return self._send(200, {"name": "image", "properties": {k: {} for k in image}, "additionalProperties": {"type": "string"}})
        self._send(404, {"message": "not found"})
    def log_message(self, fmt, *a): sys.stderr.write("glance-stub " + fmt % a + "\n")
PORT = int(sys.argv[1])
ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
