"""Training readers straight to the storage nodes (issue 63): a cluster of a real etcd, four
nodes with R=3 (so no node holds every placement group), each with an S3 read endpoint
(`packrat node --s3-listen`), and a gateway. A gateway tells a client the routes
(`GET /BUCKET?routes`); a node answers GetObject, HeadObject and batch GET of what it holds,
checking SigV4 itself, a misdirected read with 421 and its map's epoch, and nothing else;
`packrat_client` splits a batch GET (and an epoch stream, planned by the gateway) by node and
asks the gateway for what a node does not answer (a node killed between two of its reads
here). Nothing is mocked."""

import concurrent.futures
import hashlib
import json
import os
import threading
import urllib.request

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

import conftest
from cluster import overwrite_in_turn, start_cluster, version_of, versioned_body, wait_for


@pytest.fixture
def four(workdir, request):
    etcd, nodes, (gw,) = start_cluster(workdir / f"direct-{request.node.name}", nodes=4, s3=True)
    yield etcd, nodes, gw
    for p in [gw, *nodes]:
        p.stop()
    etcd.stop()


def s3_at(endpoint, ak=conftest.ROOT_AK, sk=conftest.ROOT_SK):
    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=ak, aws_secret_access_key=sk,
        region_name=conftest.REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def routes_of(gw, bucket):
    pc = gw.packrat()
    resp = pc._send_once("GET", pc._url(bucket, query=[("routes", "")]))
    return json.loads(resp.data)


def code_of(e):
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def metric(endpoint, name, **labels):
    """The sum of a metric's samples at `endpoint`'s /metrics whose labels include `labels`."""
    text = urllib.request.urlopen(endpoint + "/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_node_answers_the_reads_of_what_it_holds_and_nothing_else(four):
    etcd, nodes, gw = four
    g = gw.client()
    g.create_bucket(Bucket="direct")
    bodies = {f"train/{i:03d}.jpg": os.urandom(1000 + 97 * i) for i in range(40)}
    for k, v in bodies.items():
        g.put_object(Bucket="direct", Key=k, Body=v)

    routes = routes_of(gw, "direct")
    assert set(routes["nodes"].values()) == {n.s3_endpoint for n in nodes}
    assert routes["pgs"] == len(routes["readers"]) > 0
    assert all(len(r) == 3 for r in routes["readers"]), "R=3, every PG caught up"
    by_url = {url: nid for nid, url in routes["nodes"].items()}
    from packrat_client.routes import pg_of

    holds = {n.s3_endpoint: [] for n in nodes}
    lacks = {n.s3_endpoint: [] for n in nodes}
    for k in bodies:
        readers = routes["readers"][pg_of(routes["bucket_id"], k, routes["pgs"])]
        for n in nodes:
            (holds if by_url[n.s3_endpoint] in readers else lacks)[n.s3_endpoint].append(k)
    assert all(lacks.values()), "with 4 nodes and R=3 every node lacks some key"

    for n in nodes:
        c = s3_at(n.s3_endpoint)
        for k in holds[n.s3_endpoint][:5]:
            got = c.get_object(Bucket="direct", Key=k)
            assert got["Body"].read() == bodies[k]
            assert got["ETag"] == '"' + hashlib.md5(bodies[k]).hexdigest() + '"'
            assert c.head_object(Bucket="direct", Key=k)["ContentLength"] == len(bodies[k])
            assert c.get_object(Bucket="direct", Key=k, Range="bytes=10-19")["Body"].read() == bodies[k][10:20]
        # A key of a PG this node does not hold: 421, naming the node's map epoch.
        k = lacks[n.s3_endpoint][0]
        with pytest.raises(ClientError) as e:
            c.get_object(Bucket="direct", Key=k)
        assert code_of(e) == ("PackratMisdirected", 421)
        assert int(e.value.response["ResponseMetadata"]["HTTPHeaders"]["x-packrat-map-epoch"]) >= routes["epoch"]
        # A missing key of a PG it holds is the usual 404.
        missing = next(f"none/{i}" for i in range(1000)
                       if by_url[n.s3_endpoint] in routes["readers"][pg_of(routes["bucket_id"], f"none/{i}", routes["pgs"])])
        with pytest.raises(ClientError) as e:
            c.get_object(Bucket="direct", Key=missing)
        assert code_of(e) == ("NoSuchKey", 404)

    c = s3_at(nodes[0].s3_endpoint)
    mine = holds[nodes[0].s3_endpoint][0]
    # Nothing but reads: writes, listings, bucket calls and the admin API go to a gateway.
    for call in (lambda: c.put_object(Bucket="direct", Key="w", Body=b"x"),
                 lambda: c.delete_object(Bucket="direct", Key=mine),
                 lambda: c.list_objects_v2(Bucket="direct"),
                 lambda: c.list_buckets(),
                 lambda: c.get_object_tagging(Bucket="direct", Key=mine),
                 lambda: c.create_bucket(Bucket="other")):
        with pytest.raises(ClientError) as e:
            call()
        assert code_of(e) == ("MethodNotAllowed", 405)
    assert g.get_object(Bucket="direct", Key=mine)["Body"].read() == bodies[mine], "the refused delete did nothing"
    with pytest.raises(urllib.error.HTTPError) as h:
        urllib.request.urlopen(nodes[0].s3_endpoint + "/_packrat/admin/status", timeout=10)
    assert h.value.code == 405

    # SigV4 checked at the node with the cluster's keys: a wrong secret, and no signature on
    # a private bucket, are refused; a key made through the gateway works at once.
    with pytest.raises(ClientError) as e:
        s3_at(nodes[0].s3_endpoint, sk="not-the-secret").get_object(Bucket="direct", Key=mine)
    assert code_of(e) == ("SignatureDoesNotMatch", 403)
    with pytest.raises(urllib.error.HTTPError) as h:
        urllib.request.urlopen(f"{nodes[0].s3_endpoint}/direct/{mine}", timeout=10)
    assert h.value.code == 403
    admin = gw.packrat()
    made = admin._send_once("POST", gw.endpoint + "/_packrat/admin/keys",
                            body=json.dumps({"name": "reader"}).encode(),
                            headers={"Content-Type": "application/json"})
    key = json.loads(made.data)
    stranger = s3_at(nodes[0].s3_endpoint, key["access_key"], key["secret_key"])
    with pytest.raises(ClientError) as e:
        stranger.get_object(Bucket="direct", Key=mine)
    assert code_of(e) == ("AccessDenied", 403), "another owner's key may not read the bucket"

    # A node tells no routes (a gateway does).
    with pytest.raises(urllib.error.HTTPError) as h:
        urllib.request.urlopen(f"{nodes[0].s3_endpoint}/direct?routes", timeout=10)
    assert h.value.code == 405


@pytest.mark.local_only("a gateway has routes: the tests above")
def test_one_server_has_no_routes(server):
    """`packrat serve` answers `?routes` with 501 (every read has one place), and
    packrat_client then reads through it as always."""
    c = server.client()
    c.create_bucket(Bucket="no-routes")
    c.put_object(Bucket="no-routes", Key="k", Body=b"here")
    pc = server.packrat()
    with pytest.raises(Exception) as e:
        routes_of(server, "no-routes")
    assert (e.value.status, e.value.code) == (501, "NotImplemented")
    got = list(pc.batch_get("no-routes", ["k"]))
    assert [(s.name, s.data) for s in got] == [("k", b"here")]
    assert (pc.direct_items, pc.fallback_items) == (0, 0)


def test_packrat_client_reads_a_batch_from_the_nodes(four):
    etcd, nodes, gw = four
    g = gw.client()
    g.create_bucket(Bucket="shards")
    bodies = {f"s/{i:04d}.bin": os.urandom(512 + (i * 131) % 9000) for i in range(300)}
    for k, v in bodies.items():
        g.put_object(Bucket="shards", Key=k, Body=v)
    keys = sorted(bodies)
    gw_batches = metric(gw.endpoint, "packrat_requests_total", op="BatchGet")
    node_batches = [metric(n.s3_endpoint, "packrat_requests_total", op="BatchGet") for n in nodes]
    here = [metric(n.endpoint, "packrat_node_batches_read_here_total") for n in nodes]

    pc = gw.packrat()
    asked = keys + ["s/none", keys[3]]
    got = list(pc.batch_get("shards", asked))
    assert [s.name for s in got] == asked, "request order, every item once (a repeat twice)"
    for s in got[:-2] + got[-1:]:
        assert s.ok and s.data == bodies[s.name]
        assert s.etag == hashlib.md5(bodies[s.name]).hexdigest()
    assert got[-2].error[0] == "NoSuchKey"
    assert (pc.direct_items, pc.fallback_items) == (len(asked), 0)
    assert metric(gw.endpoint, "packrat_requests_total", op="BatchGet") == gw_batches, "no batch through the gateway"
    after = [metric(n.s3_endpoint, "packrat_requests_total", op="BatchGet") for n in nodes]
    assert all(a > b for a, b in zip(after, node_batches)), "every node answered its part"
    # Each node planned and read its parts in its own store (nothing was being written).
    parts = [a - b for a, b in zip(after, node_batches)]
    assert [metric(n.endpoint, "packrat_node_batches_read_here_total") - h for n, h in zip(nodes, here)] == parts
    assert sum(metric(n.endpoint, "packrat_node_batches_read_by_chain_total") for n in nodes) == 0

    # Storage order: the same items, each once.
    got = list(pc.batch_get("shards", keys[:100], order="storage"))
    assert sorted(s.name for s in got) == keys[:100]
    assert all(s.data == bodies[s.name] for s in got)

    # An epoch stream: its plan from the gateway, its samples from the nodes; the same
    # samples in the same order as the gateway's own stream of that share.
    before = pc.direct_items
    share = dict(shard=(1, 2), worker=(0, 2), seed=7, epoch=3)
    routed = [(s.index, s.name, s.data) for s in pc.stream_epoch("shards", "s/", **share)]
    through = [(s.index, s.name, s.data) for s in gw.packrat(direct=False).stream_epoch("shards", "s/", **share)]
    assert routed == through and len(routed) == 75, (len(routed), len(through))
    assert pc.direct_items - before == len(routed)
    assert all(data == bodies[name] for _, name, data in routed)

    # direct=False: everything through the gateway, as before.
    plain = gw.packrat(direct=False)
    got = list(plain.batch_get("shards", keys[:50]))
    assert [s.name for s in got] == keys[:50] and plain.direct_items == 0
    assert metric(gw.endpoint, "packrat_requests_total", op="BatchGet") > gw_batches


def test_batches_at_the_nodes_read_acknowledged_writes_while_keys_are_overwritten(four):
    """Client batches straight to the nodes while two writers overwrite their keys through the
    gateway. A node plans a batch in its own store only when no copy it would read is dirty
    (a write on its way down the chain), else it reads the batch the ordinary way, asking the
    tail for a dirty copy. Either way every entry is a whole version, never older than the
    newest acknowledged before the batch was asked. Runs until both ways were taken."""
    etcd, nodes, gw = four
    g = gw.client()
    g.create_bucket(Bucket="hot")
    keys = [f"k/{i:03d}" for i in range(60)]

    def version(key, v):
        return versioned_body(key, v, 8 + v % 5)

    acked = {k: 0 for k in keys}
    for k in keys:
        g.put_object(Bucket="hot", Key=k, Body=version(k, 0))
    stop = threading.Event()
    lock = threading.Lock()

    def reader():
        pc = gw.packrat()
        batches = 0
        while not stop.is_set():
            with lock:
                floor = dict(acked)
            got = list(pc.batch_get("hot", keys))
            assert [s.name for s in got] == keys
            for s in got:
                assert s.ok, (s.name, s.error)
                v = version_of(s.name, s.data, version)
                assert v >= floor[s.name], (s.name, v, floor[s.name], "an acknowledged write not read")
            batches += 1
        return batches, pc.direct_items, pc.fallback_items

    def count(name):
        return sum(metric(n.endpoint, name) for n in nodes)

    pool = concurrent.futures.ThreadPoolExecutor(4)
    writers = [pool.submit(overwrite_in_turn, gw, "hot", keys[w::2], version, acked, lock, stop) for w in range(2)]
    readers = [pool.submit(reader) for _ in range(2)]
    try:
        wait_for("batches read both ways at the nodes",
                 lambda: (count("packrat_node_batches_read_by_chain_total") > 0
                          and count("packrat_node_batches_read_here_total") > 0)
                 or any(f.done() for f in writers + readers), timeout=60)
    finally:
        stop.set()
        for f in writers:
            f.result()
        done = [f.result() for f in readers]
    here = count("packrat_node_batches_read_here_total")
    chain = count("packrat_node_batches_read_by_chain_total")
    print(f"batches {[d[0] for d in done]}; node parts read here {here}, by the chain {chain}")
    assert here > 0 and chain > 0
    assert all(fallback == 0 for _, _, fallback in done), "every part was answered by its node"


def test_a_node_killed_while_a_client_reads_from_it_is_read_around(four):
    """The client reads a batch in windows; after the first window (read from the nodes), the
    node that served part of it is killed (SIGKILL). Its part of the next windows fails to
    connect and is asked of the gateway, which fails over to the other replicas: every sample
    arrives once, with its bytes."""
    import packrat_client.client as client_module

    etcd, nodes, gw = four
    g = gw.client()
    g.create_bucket(Bucket="epoch")
    bodies = {f"e/{i:04d}": os.urandom(4096 + i) for i in range(240)}
    for k, v in bodies.items():
        g.put_object(Bucket="epoch", Key=k, Body=v)
    keys = sorted(bodies)
    pc = gw.packrat()
    window = client_module._DIRECT_WINDOW
    client_module._DIRECT_WINDOW = 60
    try:
        seen = []
        it = pc.batch_get("epoch", keys)
        for s in it:
            seen.append(s)
            if len(seen) == 60:
                assert pc.direct_items == 60
                nodes[1].kill9()
        assert [s.name for s in seen] == keys, "every sample once, in order"
        assert all(s.ok and s.data == bodies[s.name] for s in seen)
        assert pc.fallback_items > 0, "the killed node's parts went to the gateway"
        assert pc.direct_items + pc.fallback_items == len(keys)
    finally:
        client_module._DIRECT_WINDOW = window


def test_a_node_killed_in_the_middle_of_its_answer_is_read_around(four):
    """The node answering a client's part is killed (SIGKILL) while its answer streams: after
    the client took a few of its samples, with tens of megabytes still to come, more than the
    sockets hold. The part's end is cut; the samples it did not deliver go to the gateway,
    which reads them from the other replicas: every sample once, whole."""
    etcd, nodes, gw = four
    g = gw.client()
    g.create_bucket(Bucket="big")
    bodies = {f"b/{i:03d}": os.urandom((1 << 20) + i) for i in range(120)}
    for k, v in bodies.items():
        g.put_object(Bucket="big", Key=k, Body=v)
    keys = sorted(bodies)
    pc = gw.packrat()
    victim = nodes[2]
    part_of = pc._batch_get_via
    seen_from_victim = []

    def via(bucket, items, order, on_error, base=None, epoch=None):
        for s in part_of(bucket, items, order, on_error, base=base, epoch=epoch):
            if base == victim.s3_endpoint:
                seen_from_victim.append(s.name)
                if len(seen_from_victim) == 3:
                    victim.kill9()
            yield s

    pc._batch_get_via = via
    part = [k for k in keys if pc._routes_for("big").node_for(k) == victim.s3_endpoint]
    assert len(part) >= 12, "the victim's part is tens of megabytes"
    got = list(pc.batch_get("big", keys))
    assert [s.name for s in got] == keys, "every sample once, in order"
    assert all(s.ok and s.data == bodies[s.name] for s in got)
    assert 3 <= len(seen_from_victim) < len(part), "the victim's answer was cut"
    assert pc.fallback_items == len(part) - len(seen_from_victim), "the rest of its part went to the gateway"
    assert pc.direct_items + pc.fallback_items == len(keys)


def test_a_client_forked_after_reading_from_the_nodes_reads_on(four):
    """A DataLoader forks its workers with the dataset's client inside: a client that read from
    the nodes before the fork (its part threads started) reads from them in the child too,
    rather than wait forever on threads the child does not have."""
    etcd, nodes, gw = four
    g = gw.client()
    g.create_bucket(Bucket="forked")
    bodies = {f"f/{i:03d}": os.urandom(2048 + i) for i in range(64)}
    for k, v in bodies.items():
        g.put_object(Bucket="forked", Key=k, Body=v)
    keys = sorted(bodies)
    pc = gw.packrat()
    assert [s.data for s in pc.batch_get("forked", keys)] == [bodies[k] for k in keys]
    assert pc.direct_items == len(keys)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = 0
        try:
            got = list(pc.batch_get("forked", keys[::-1]))
            ok = int([s.data for s in got] == [bodies[k] for k in keys[::-1]] and pc.direct_items == 2 * len(keys))
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    os.close(w)
    import select

    ready, _, _ = select.select([r], [], [], 30)
    try:
        assert ready, "the forked client's batch did not end within 30 s"
        assert os.read(r, 1) == b"\x01", "the forked client read wrong or not from the nodes"
    finally:
        os.close(r)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
