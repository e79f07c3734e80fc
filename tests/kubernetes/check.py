#!/usr/bin/env python3
"""Checks deploy/kubernetes/ (run by tests/kubernetes/run.sh, in the venv holding
kubernetes-validate and PyYAML).

1. Every manifest against the pinned Kubernetes version's schemas, strictly (unknown
   fields rejected), and a manifest with an unknown field is rejected (the validator
   really judges).
2. What the manifests promise, read from them: the DaemonSet shares the socket's
   directory through a hostPath, probes by PING on that socket, reads its config from
   the ConfigMap and the Redis password from the Secret as a file; Redis has maxmemory,
   noeviction and no persistence; the example application mounts the same directory
   and is in the socket's group.
3. The ConfigMap's files run for real: Redis' config under redis-server (via the
   container's own start command), the daemon's config under `ratelimitd --check` and
   then as a daemon on that Redis, the probe's command against it (and failing once
   the daemon is gone). Paths under /run, /etc and /var are moved into a temp dir.
   As root, with the pods' users: the init container's command hands the socket
   directory to the daemon's uid, the daemon and its probes run as that uid with the
   Secret's file readable through fsGroup, `ratelimitd ctl` works as that uid (what
   `kubectl exec` runs as), the example application's uid gets decisions but not the
   operator verbs, and a uid outside the daemon's group cannot reach the socket.

Prints `kubernetes: N passed, M failed, K skipped` last; exit status 1 on a failure.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib

import yaml

RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


def ok(name):
    RESULTS["passed"] += 1
    print(f"ok {name}")


def fail(name, why):
    RESULTS["failed"] += 1
    print(f"FAIL {name}: {why}")


def skip(name, why):
    RESULTS["skipped"] += 1
    print(f"SKIP {name}: {why}")


def check(name, cond, why):
    if cond:
        ok(name)
    else:
        fail(name, why)
    return cond


def load_docs(root):
    """Every document of every manifest: {(kind, name): (file, doc)}."""
    docs = {}
    for d in ("deploy/kubernetes", "deploy/kubernetes/examples"):
        for f in sorted(os.listdir(os.path.join(root, d))):
            if f.endswith(".yaml"):
                path = os.path.join(d, f)
                with open(os.path.join(root, path), encoding="utf-8") as fh:
                    for doc in yaml.safe_load_all(fh):
                        if doc:
                            docs[(doc["kind"], doc["metadata"]["name"])] = (path, doc)
    return docs


def validate(args, docs):
    files = sorted({path for path, _ in docs.values()})
    for path in files:
        r = subprocess.run(
            [args.validator, "-k", args.kubernetes_version, "--strict", "--quiet", path],
            cwd=args.root, capture_output=True, text=True, check=False,
        )
        check(f"schema {path} (Kubernetes {args.kubernetes_version})", r.returncode == 0,
              (r.stdout + r.stderr).strip())
    # The validator must reject what Kubernetes would: an unknown field.
    path, ds = docs[("DaemonSet", "ratelimitd")]
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["replicas"] = 2
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(bad, fh)
    r = subprocess.run([args.validator, "-k", args.kubernetes_version, "--strict", "--quiet", fh.name],
                       capture_output=True, text=True, check=False)
    os.unlink(fh.name)
    check("schema rejects a DaemonSet with replicas (an unknown field)", r.returncode != 0,
          "kubernetes-validate accepted it: " + (r.stdout + r.stderr).strip())


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def mount_of(pod, container, path):
    """The volume mounted at `path` in `container` of `pod`, or None."""
    for m in container.get("volumeMounts", []):
        if m["mountPath"] == path:
            return next(v for v in pod["volumes"] if v["name"] == m["name"])
    return None


def probe_command(container, which):
    return container[which]["exec"]["command"]


def read_manifests(docs):
    """The pieces the checks need, asserting the shape they rely on."""
    _, ds = docs[("DaemonSet", "ratelimitd")]
    pod = pod_spec(ds)
    daemon = next(c for c in pod["containers"] if c["name"] == "ratelimitd")
    args = daemon["args"]
    config_path = args[args.index("--config") + 1]
    config_vol = mount_of(pod, daemon, os.path.dirname(config_path))
    cm_name = config_vol["configMap"]["name"]
    _, cm = docs[("ConfigMap", cm_name)]
    toml_text = cm["data"][os.path.basename(config_path)]
    _, sts = docs[("StatefulSet", "ratelimit-redis")]
    redis_pod = pod_spec(sts)
    redis = redis_pod["containers"][0]
    redis_cm_name = next(v for v in redis_pod["volumes"] if "configMap" in v)["configMap"]["name"]
    _, redis_cm = docs[("ConfigMap", redis_cm_name)]
    return {
        "ds": ds, "pod": pod, "daemon": daemon, "config_path": config_path,
        "toml": toml_text, "config": tomllib.loads(toml_text),
        "sts": sts, "redis_pod": redis_pod, "redis": redis,
        "redis_conf": redis_cm["data"]["redis.conf"],
        "app": pod_spec(docs[("Deployment", "example-app")][1]),
        "secret": docs[("Secret", "ratelimit-redis-auth")][1],
    }


def memory_bytes(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", str(q))
    return int(m.group(1)) * units.get(m.group(2), 1)


def redis_directive(conf, name):
    for line in conf.splitlines():
        parts = line.split(None, 1)
        if parts and parts[0] == name:
            return parts[1].strip() if len(parts) > 1 else ""
    return None


def static_checks(m):
    cfg, pod, daemon = m["config"], m["pod"], m["daemon"]
    sock = cfg["server"]["socket"]
    sock_dir = os.path.dirname(sock)
    vol = mount_of(pod, daemon, sock_dir)
    check("daemonset shares the socket's directory through a hostPath",
          vol is not None and vol.get("hostPath", {}).get("path") == sock_dir
          and vol["hostPath"].get("type") == "DirectoryOrCreate",
          f"{sock_dir} is not a DirectoryOrCreate hostPath mount: {vol}")
    for which in ("readinessProbe", "livenessProbe"):
        cmd = " ".join(probe_command(daemon, which))
        check(f"daemonset {which} sends PING to {sock}", "PING" in cmd and sock in cmd and "PONG" in cmd, cmd)
    check("daemonset reads its config from the ConfigMap", m["toml"].strip() != "", "empty config")
    pw = cfg["redis"].get("password_file")
    pw_vol = mount_of(pod, daemon, os.path.dirname(pw)) if pw else None
    secret = m["secret"]
    secret_keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
    check("daemonset reads the Redis password from the Secret, as a file",
          pw_vol is not None and pw_vol.get("secret", {}).get("secretName") == secret["metadata"]["name"]
          and os.path.basename(pw) in secret_keys,
          f"redis.password_file = {pw}, mounted volume {pw_vol}, secret keys {secret_keys}")
    gid = pod["securityContext"]["runAsGroup"]
    mode = int(cfg["server"].get("socket_mode", "0660"), 8)
    check("daemonset's socket is reachable by its group only",
          mode & 0o060 == 0o060 and mode & 0o007 == 0 and "chmod 0750" in " ".join(
              c for ic in pod.get("initContainers", []) for c in ic.get("command", [])),
          f"socket_mode {oct(mode)}")
    app = m["app"]
    app_c = app["containers"][0]
    app_vol = mount_of(app, app_c, sock_dir)
    check("example app mounts the socket's directory and is in the daemon's group",
          app_vol is not None and app_vol.get("hostPath", {}).get("path") == sock_dir
          and gid in app["securityContext"].get("supplementalGroups", []),
          f"volume {app_vol}, groups {app['securityContext'].get('supplementalGroups')}, daemon gid {gid}")

    conf = m["redis_conf"]
    maxmemory = redis_directive(conf, "maxmemory")
    limit = m["redis"]["resources"]["limits"]["memory"]
    check("redis has maxmemory-policy noeviction", redis_directive(conf, "maxmemory-policy") == "noeviction",
          f"maxmemory-policy {redis_directive(conf, 'maxmemory-policy')}")
    mm = re.fullmatch(r"(\d+)(mb|gb)", maxmemory or "")
    check("redis has maxmemory below the container's memory limit",
          mm is not None and int(mm.group(1)) * (2**20 if mm.group(2) == "mb" else 2**30) < memory_bytes(limit),
          f"maxmemory {maxmemory}, limit {limit}")
    check("redis keeps no persistence",
          redis_directive(conf, "save") == '""' and redis_directive(conf, "appendonly") == "no"
          and "volumeClaimTemplates" not in m["sts"]["spec"],
          "save/appendonly/volumeClaimTemplates")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def relocate(text, tmp):
    """Moves the container paths under `tmp` (same layout)."""
    for p in ("/run/secrets/ratelimitd", "/run/secrets/redis", "/run/ratelimitd", "/run/redis",
              "/etc/ratelimitd", "/etc/redis", "/var/lib/ratelimitd"):
        text = text.replace(p, tmp + p)
    return text


def request(sock_path, line):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(sock_path)
        s.sendall(line.encode() + b"\n")
        return s.makefile().readline().strip()


def as_pod(pod):
    """subprocess arguments running a command as `pod`'s securityContext does (uid, gid,
    fsGroup and supplementalGroups), when this process is root; else None."""
    if os.geteuid() != 0:
        return None
    sc = pod["securityContext"]
    groups = [g for g in [sc.get("fsGroup"), *sc.get("supplementalGroups", [])] if g is not None]
    return {"user": sc["runAsUser"], "group": sc["runAsGroup"], "extra_groups": groups}


def live_checks(args, m, tmp):
    for tool in ("redis-server", "redis-cli", "socat"):
        if shutil.which(tool) is None:
            skip("live checks", f"{tool} not found")
            return
    for d in ("/run/secrets/ratelimitd", "/run/secrets/redis", "/run/ratelimitd", "/run/redis",
              "/etc/ratelimitd", "/etc/redis", "/var/lib/ratelimitd", "/data"):
        os.makedirs(tmp + d, exist_ok=True)
    password = "k8s-test-" + os.urandom(8).hex()
    for d in ("/run/secrets/ratelimitd", "/run/secrets/redis"):
        with open(f"{tmp}{d}/password", "w", encoding="utf-8") as fh:
            fh.write(password + "\n")
        os.chmod(f"{tmp}{d}/password", 0o440)
    port = free_port()
    conf = relocate(m["redis_conf"], tmp).replace("port 6379", f"port {port}")
    conf = re.sub(r"(?m)^bind .*$", "bind 127.0.0.1", conf)
    with open(f"{tmp}/etc/redis/redis.conf", "w", encoding="utf-8") as fh:
        fh.write(conf)
    procs = []
    try:
        # Redis, started by the container's own command.
        redis_cmd = [relocate(a, tmp) for a in m["redis"]["command"]]
        redis = subprocess.Popen(redis_cmd, cwd=tmp + "/data", stdout=open(tmp + "/redis.log", "w"),
                                 stderr=subprocess.STDOUT)
        procs.append(redis)
        ready = [relocate(a, tmp).replace("redis-cli", f"redis-cli -p {port}")
                 for a in m["redis"]["readinessProbe"]["exec"]["command"]]
        up = wait_for(lambda: subprocess.run(ready, capture_output=True, check=False).returncode == 0, 10)
        if not check("redis starts from its ConfigMap and the Secret; its readiness probe passes", up,
                     open(tmp + "/redis.log", encoding="utf-8").read()[-2000:]):
            return
        env = dict(os.environ, REDISCLI_AUTH=password)

        def config_get(name):
            r = subprocess.run(["redis-cli", "-p", str(port), "config", "get", name], env=env,
                               capture_output=True, text=True, check=False)
            return r.stdout.split("\n")[1] if r.stdout.count("\n") >= 2 else r.stdout

        got = {k: config_get(k) for k in ("maxmemory", "maxmemory-policy", "save", "appendonly")}
        check("redis runs with maxmemory 256 MiB, noeviction, no persistence",
              got == {"maxmemory": str(256 * 2**20), "maxmemory-policy": "noeviction", "save": "", "appendonly": "no"},
              str(got))
        r = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False)
        check("redis refuses a client without the password", "NOAUTH" in r.stdout + r.stderr, r.stdout + r.stderr)

        # The daemon's config, moved into tmp and pointed at this Redis.
        toml_text = relocate(m["toml"], tmp)
        toml_text = re.sub(r"(?m)^nodes = .*$", f'nodes = ["127.0.0.1:{port}"]', toml_text)
        metrics = free_port()
        toml_text = re.sub(r'(?m)^listen = "0\.0\.0\.0:9090"$', f'listen = "127.0.0.1:{metrics}"', toml_text)
        config = relocate(m["config_path"], tmp)
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(toml_text)
        if not os.access(args.daemon, os.X_OK):
            fail("daemon config check", f"no ratelimitd binary at {args.daemon} (cargo build first)")
            return
        r = subprocess.run([args.daemon, "--config", config, "--check"], capture_output=True, text=True, check=False)
        if not check("the ConfigMap's config passes ratelimitd --check", r.returncode == 0, r.stdout + r.stderr):
            return
        # As root: the pods' users, files and directories as Kubernetes makes them.
        daemon_user, app_user = as_pod(m["pod"]), as_pod(m["app"])
        if daemon_user:
            fs_group = m["pod"]["securityContext"]["fsGroup"]
            os.chmod(tmp, 0o755)
            pw = relocate(m["config"]["redis"]["password_file"], tmp)
            os.chown(pw, 0, fs_group)  # a Secret volume: group fsGroup, defaultMode 0440
            os.chmod(relocate("/var/lib/ratelimitd", tmp), 0o777)  # an emptyDir
            init = [relocate(a, tmp) for a in m["pod"]["initContainers"][0]["command"]]
            r = subprocess.run(init, capture_output=True, text=True, check=False)
            st = os.stat(relocate("/run/ratelimitd", tmp))
            check("the init container hands the socket directory to the daemon (mode 0750)",
                  r.returncode == 0 and (st.st_uid, st.st_gid, st.st_mode & 0o7777)
                  == (daemon_user["user"], daemon_user["group"], 0o750), f"{r.stderr} {st}")
        else:
            skip("the pods' uids and groups", "not root: the daemon and the probes run as this user")
        as_daemon = daemon_user or {}
        daemon = subprocess.Popen([args.daemon, *[relocate(a, tmp) for a in m["daemon"]["args"]]],
                                  stdout=open(tmp + "/daemon.log", "w"), stderr=subprocess.STDOUT, **as_daemon)
        procs.append(daemon)
        sock = relocate(m["config"]["server"]["socket"], tmp)
        probe = [relocate(a, tmp) for a in probe_command(m["daemon"], "readinessProbe")]
        up = wait_for(lambda: subprocess.run(probe, capture_output=True, check=False, **as_daemon).returncode == 0, 15)
        if not check("the daemon starts from the ConfigMap; its PING probe passes", up,
                     open(tmp + "/daemon.log", encoding="utf-8").read()[-2000:]):
            return
        reply = request(sock, "CHECK rides_request rider:42 1").split()
        check("a CHECK through the shared socket is decided in Redis",
              reply[:1] == ["ALLOW"] and reply[5:6] == ["redis"], " ".join(reply))
        if daemon_user:
            ctl = [args.daemon, "ctl", "--config", config, "--json", "rules"]
            r = subprocess.run(ctl, capture_output=True, text=True, check=False, **daemon_user)
            check("ratelimitd ctl works as the daemon's uid (kubectl exec): server.admin_uids",
                  r.returncode == 0 and "rides_request" in r.stdout, r.stdout + r.stderr)
            ask = ["sh", "-c", f"printf 'CHECK rides_request rider:7 1\\n' | socat -t 1 - UNIX-CONNECT:{sock}"]
            r = subprocess.run(ask, capture_output=True, text=True, check=False, **app_user)
            check("the example app's uid, in the daemon's group, gets decisions",
                  r.stdout.startswith("ALLOW "), r.stdout + r.stderr)
            r = subprocess.run(ctl, capture_output=True, text=True, check=False, **app_user)
            check("the example app's uid may not use the operator verbs",
                  r.returncode != 0 and "ERR PERM" in r.stderr, r.stdout + r.stderr)
            outsider = dict(app_user, extra_groups=[])
            r = subprocess.run(ask, capture_output=True, text=True, check=False, **outsider)
            check("a uid outside the daemon's group cannot reach the socket",
                  not r.stdout.startswith("ALLOW") and "Permission denied" in r.stderr, r.stdout + r.stderr)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        live = [relocate(a, tmp) for a in probe_command(m["daemon"], "livenessProbe")]
        r = subprocess.run(live, capture_output=True, check=False, **as_daemon)
        check("the liveness probe fails once the daemon is gone", r.returncode != 0, "it passed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--validator", required=True)
    ap.add_argument("--kubernetes-version", required=True)
    args = ap.parse_args()
    docs = load_docs(args.root)
    validate(args, docs)
    try:
        m = read_manifests(docs)
    except (KeyError, StopIteration, ValueError, TypeError) as e:
        fail("manifests have the expected shape", repr(e))
    else:
        static_checks(m)
        tmp = tempfile.mkdtemp(prefix="rld-k8s-", dir="/tmp")
        try:
            live_checks(args, m, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"kubernetes: {RESULTS['passed']} passed, {RESULTS['failed']} failed, {RESULTS['skipped']} skipped")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
