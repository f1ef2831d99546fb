#!/usr/bin/python3
"""Every listener, probed as an attacker without a key would: the services and methods each one
offers are listed through gRPC reflection (as any client can), and each method is called
without a credential and with a tenant's API key. Only the Generation API (with the key),
health and reflection answer; everything else is UNAUTHENTICATED or PERMISSION_DENIED. Covered:
`tandem serve` (one process), `tandem serve --prefill-workers 1 --decode-workers 1`, a
standalone `tandem router`, and the cluster's `tandem prefill` and `tandem decode` workers.

On the workers (cluster secret on), a token forged without the secret, one minted for another
method and one replayed after the time window are refused; the router's own tokens pass (the
cluster serves). The Worker API is not on `tandem serve`'s public port at all, and calling it
there anyway (the old side door: Worker/Decode with any cache salt) is refused. An admin-scoped
key reads RouterAdmin; a tenant key does not."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402

from tandem_testlib import (INTERNAL_TOKEN_KEY, Cluster, Server, check, cluster_secret,  # noqa: E402
                            internal_token, load_stubs)

TENANT_KEY = "sk-tenant-acme-0123456789"
ADMIN_KEY = "sk-operator-0123456789"
DENIED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection")


def sha256(s):
    import hashlib
    return hashlib.sha256(s.encode()).hexdigest()


# --- a minimal protobuf wire reader/writer for the reflection messages -------------------------

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_bytes(number, data):
    return varint(number << 3 | 2) + varint(len(data)) + data


def read_fields(data):
    """[(field number, wire type, value)] of one message (varints and length-delimited only)."""
    out, i = [], 0
    while i < len(data):
        key, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        number, wire = key >> 3, key & 7
        if wire == 0:
            v, shift = 0, 0
            while True:
                b = data[i]
                i += 1
                v |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            out.append((number, wire, v))
        elif wire == 2:
            n, shift = 0, 0
            while True:
                b = data[i]
                i += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            out.append((number, wire, data[i:i + n]))
            i += n
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return out


def reflect(channel, requests):
    call = channel.stream_stream(REFLECTION)
    return list(call(iter(requests), timeout=10))


def list_methods(channel):
    """{service: [(method, client_streaming, server_streaming)]} through reflection."""
    from google.protobuf import descriptor_pb2
    # ServerReflectionRequest.list_services = 7; response.list_services_response = 6,
    # ListServiceResponse.service = 1, ServiceResponse.name = 1.
    [resp] = reflect(channel, [field_bytes(7, b"")])
    lists = [v for n, _, v in read_fields(resp) if n == 6]
    services = [dict((n, v) for n, _, v in read_fields(s))[1].decode()
                for n, _, s in read_fields(lists[0]) if n == 1]
    out = {}
    for service in services:
        # file_containing_symbol = 4; file_descriptor_response = 4, file_descriptor_proto = 1.
        [resp] = reflect(channel, [field_bytes(4, service.encode())])
        fds = [v for n, _, v in read_fields(resp) if n == 4]
        if not fds and service == "grpc.health.v1.Health":
            # gRPC C++ serves health without a descriptor in the reflection pool; its methods
            # are fixed by the health protocol.
            out[service] = [("Check", False, False), ("Watch", False, True)]
            continue
        check(fds, f"reflection describes {service}: {read_fields(resp)}")
        methods = None
        for _, _, raw in read_fields(fds[0]):
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            for s in fd.service:
                if (f"{fd.package}.{s.name}" if fd.package else s.name) == service:
                    methods = [(m.name, m.client_streaming, m.server_streaming) for m in s.method]
        check(methods is not None, f"reflection gives the methods of {service}")
        out[service] = methods
    return out


def call(channel, service, method, client_streaming, server_streaming, metadata):
    """Calls with an empty request; returns the status code (OK for a stream that produced a
    message, as health's Watch does: it never ends by itself)."""
    path = f"/{service}/{method}"
    try:
        if service.startswith("grpc.reflection"):
            reflect(channel, [field_bytes(7, b"")])
            return grpc.StatusCode.OK
        if client_streaming:
            fn = channel.stream_stream(path) if server_streaming else channel.stream_unary(path)
            result = fn(iter([b""]), timeout=10, metadata=metadata)
        elif server_streaming:
            result = channel.unary_stream(path)(b"", timeout=10, metadata=metadata)
        else:
            channel.unary_unary(path)(b"", timeout=10, metadata=metadata)
            return grpc.StatusCode.OK
        for _ in result:
            result.cancel()
            break
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK  # a stream that answered, cancelled by us
        return e.code()


def probe_listener(name, address, answering, absent=()):
    """Lists every service of `address` and calls every method without a credential and with
    the tenant key. `answering`: the services that answer with the key (beyond health and
    reflection). `absent`: services the listener must not offer."""
    channel = grpc.insecure_channel(address)
    services = list_methods(channel)
    for s in absent:
        check(s not in services, f"{name}: {s} must not be offered: {sorted(services)}")
    calls = 0
    for service, methods in services.items():
        for method, cs, ss in methods:
            for who, md in (("no credential", None),
                            ("a tenant key", [("authorization", f"Bearer {TENANT_KEY}")])):
                code = call(channel, service, method, cs, ss, md)
                calls += 1
                if service in OPEN_SERVICES:
                    check(code == grpc.StatusCode.OK, f"{name}: {service}/{method} with {who}: "
                          f"{code}, want an answer")
                elif service in answering and md is not None:
                    check(code not in DENIED + (grpc.StatusCode.UNIMPLEMENTED,),
                          f"{name}: {service}/{method} with {who}: {code}, want an answer")
                else:
                    check(code in DENIED, f"{name}: {service}/{method} with {who}: {code}, want "
                          f"UNAUTHENTICATED or PERMISSION_DENIED")
    answered = f"{', '.join(sorted(answering))} (with a key), " if answering else ""
    print(f"ok: {name} ({address}): {len(services)} services, {calls} calls: only "
          f"{answered}health and reflection answer: {sorted(services)}")
    return services


def check_worker_tokens(stubs, role, address):
    """Tokens on a worker with the cluster secret: only a fresh one for the called method."""
    secret = cluster_secret()[1]
    stub = stubs.worker_grpc.WorkerStub(grpc.insecure_channel(address))
    info_method = "/tandem.v1.Worker/GetInfo"

    def get_info(token):
        try:
            stub.GetInfo(stubs.worker.InfoRequest(), timeout=10,
                         metadata=[(INTERNAL_TOKEN_KEY, token)])
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()

    once = internal_token(secret, info_method)
    check(get_info(once) == grpc.StatusCode.OK, f"{role}: a fresh token for GetInfo answers")
    check(get_info(once) == grpc.StatusCode.UNAUTHENTICATED,
          f"{role}: the same token again (a replay within the window) is refused")
    cases = {
        "forged (another secret)": internal_token(b"a guess at the secret 0123456789", info_method),
        "for another method (Decode)": internal_token(secret, "/tandem.v1.Worker/Decode"),
        "replayed after the window": internal_token(secret, info_method, at=time.time() - 600),
        "from the future": internal_token(secret, info_method, at=time.time() + 600),
        "malformed": "v1.garbage",
    }
    good = internal_token(secret, info_method).split(".")
    cases["with its MAC altered"] = ".".join(good[:3] + [good[3][:-1] + ("0" if good[3][-1] != "0"
                                                                          else "1")])
    cases["with its time moved"] = ".".join([good[0], str(int(good[1]) + 1)] + good[2:])
    for what, token in cases.items():
        code = get_info(token)
        check(code == grpc.StatusCode.UNAUTHENTICATED, f"{role}: a token {what}: {code}")
    print(f"ok: {role} worker: a fresh token for the method answers once; {len(cases)} bad "
          f"tokens (forged, another method's, replayed after the window, altered) and a replay "
          f"within it get UNAUTHENTICATED")


def check_admin(stubs, name, address):
    stub = stubs.admin_grpc.RouterAdminStub(grpc.insecure_channel(address))
    status = stub.GetClusterStatus(stubs.admin.ClusterStatusRequest(), timeout=10,
                                   metadata=[("authorization", f"Bearer {ADMIN_KEY}")])
    check(len(status.workers) >= 1, f"{name}: admin key reads the cluster status: {status}")
    print(f"ok: {name}: an admin-scoped key reads RouterAdmin ({len(status.workers)} workers)")


def check_side_door_closed(stubs, name, address):
    """The issue's attack: Worker/Decode on the public port with any cache salt."""
    stub = stubs.worker_grpc.WorkerStub(grpc.insecure_channel(address))
    req = stubs.worker.DecodeRequest(request_id="side-door", prompt_token_ids=[1, 2, 3],
                                     sampling=stubs.sampling.SamplingParams(max_tokens=4),
                                     cache_salt="tenant\x1facme\x1f")
    for md in (None, [("authorization", f"Bearer {TENANT_KEY}")]):
        try:
            list(stub.Decode(req, timeout=10, metadata=md))
            check(False, f"{name}: Worker/Decode streamed on the public port")
        except grpc.RpcError as e:
            check(e.code() in DENIED, f"{name}: Worker/Decode: {e.code()}")
    print(f"ok: {name}: Worker/Decode on the public port is refused")


def main():
    build_dir = sys.argv[1]
    stubs = load_stubs()
    tmp = tempfile.mkdtemp(prefix="tandem-auth-")
    keys = os.path.join(tmp, "keys.txt")
    with open(keys, "w") as f:
        f.write("tenant acme\ntenant ops\n"
                f"key {sha256(TENANT_KEY)} acme\n"
                f"key {sha256(ADMIN_KEY)} ops scopes=admin\n")
    generation = {"tandem.v1.Generation"}

    with Server(build_dir, "--api-keys", keys, "--threads", "1") as server:
        probe_listener("serve", server.address, generation, absent=("tandem.v1.Worker",))
        check_side_door_closed(stubs, "serve", server.address)
        check_admin(stubs, "serve", server.address)

    with Cluster(build_dir, 1, 1, "--api-keys", keys, "--threads", "1") as cluster:
        probe_listener("serve (cluster)", cluster.address, generation,
                       absent=("tandem.v1.Worker",))
        check_side_door_closed(stubs, "serve (cluster)", cluster.address)
        check_admin(stubs, "serve (cluster)", cluster.address)
        children = cluster.children()
        for role in ("prefill", "decode"):
            address = f"127.0.0.1:{children[role][0][1]}"
            services = probe_listener(role, address, set())
            check("tandem.v1.Worker" in services, f"{role}: offers the Worker API")
            check_worker_tokens(stubs, role, address)
        # A standalone router in front of the same workers (it proves the same secret).
        port_file = os.path.join(tmp, "router.port")
        log = open(os.path.join(tmp, "router.log"), "wb")
        router = subprocess.Popen(
            [os.path.join(build_dir, "bin", "tandem"), "router", "--port", "0", "--port-file",
             port_file, "--api-keys", keys, "--cluster-secret-file", cluster_secret()[0],
             "--prefill-addresses", f"127.0.0.1:{children['prefill'][0][1]}",
             "--decode-addresses", f"127.0.0.1:{children['decode'][0][1]}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 60
            while not os.path.exists(port_file):
                check(router.poll() is None and time.time() < deadline,
                      "router: " + open(log.name, "rb").read().decode(errors="replace"))
                time.sleep(0.05)
            address = f"127.0.0.1:{int(open(port_file).read())}"
            probe_listener("router", address, generation, absent=("tandem.v1.Worker",))
            check_admin(stubs, "router", address)
            # The router's own tokens pass: it serves through the workers.
            stub = stubs.gen_grpc.GenerationStub(grpc.insecure_channel(address))
            final = [r.final for r in stub.Generate(
                stubs.gen.GenerateRequest(text="Once upon a time",
                                          sampling=stubs.sampling.SamplingParams(max_tokens=4)),
                timeout=120, metadata=[("authorization", f"Bearer {TENANT_KEY}")])
                if r.HasField("final")]
            check(final and final[0].usage.completion_tokens == 4, f"router generates: {final}")
            print("ok: router: generation through workers that require the cluster secret")
        finally:
            router.kill()
            router.wait()


if __name__ == "__main__":
    main()
