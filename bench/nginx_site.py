#!/usr/bin/env python3
"""An nginx site serving what `packrat bench` reads: KEYS files of SIZE random bytes under
DIR/root/BUCKET/k/ (named as the load generator names its keys), and DIR/nginx.conf for one
process (no master, one worker, sendfile on, no access log) on 127.0.0.1:PORT. The load
generator creates its bucket first: a PUT of /BUCKET is answered 200.

    bench/nginx_site.py DIR PORT BUCKET KEYS SIZE      # SIZE like 4KiB, 1MiB, 100B
    nginx -c DIR/nginx.conf -p DIR
"""
import os
import sys

d, port, bucket, keys, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
units = {"KiB": 1024, "MiB": 1 << 20, "B": 1}
n = next(int(size[: -len(u)]) * f for u, f in units.items() if size.endswith(u))
files = os.path.join(d, "root", bucket, "k")
os.makedirs(files, exist_ok=True)
os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
for i in range(keys):
    with open(os.path.join(files, f"{i:08d}"), "wb") as f:
        f.write(os.urandom(n))
tmp = os.path.join(d, "tmp")
with open(os.path.join(d, "nginx.conf"), "w") as f:
    f.write(f"""daemon off;
master_process off;
worker_processes 1;
error_log {tmp}/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  sendfile on;
  keepalive_requests 100000000;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp};
  uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  server {{ listen 127.0.0.1:{port}; root {d}/root; location = /{bucket} {{ return 200; }} }}
}}
""")
