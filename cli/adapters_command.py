"""``baton adapters load|unload|list --worker ADDR``: manage a worker's LoRA adapters while it serves.

Talks to one worker (prefill or decode: both serve the adapter RPCs); to change a cluster, run it
against each worker. Prints the adapters loaded afterwards, one per line (``--json``: one object).
"""

import argparse
import json

import grpc

from common.cluster_secret import read_cluster_secret
from common.internal_tls import insecure_or_internal_channel, internal_tls
from common.rpc.cluster_secret_interceptor import with_cluster_secret
from proto.baton.v1 import workers_pb2, workers_pb2_grpc

from .cluster_secret_flag import add_cluster_secret_flag
from .tls_flags import add_internal_tls_flags


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("adapters", help="load, unload or list a worker's LoRA adapters")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    load = actions.add_parser("load", help="load a PEFT LoRA folder (on the worker's machine) by name")
    load.add_argument("name")
    load.add_argument("path", help="the folder holding adapter_config.json and adapter_model.safetensors")
    unload = actions.add_parser("unload", help="unload an adapter (refused while a request uses it)")
    unload.add_argument("name")
    listing = actions.add_parser("list", help="list the adapters loaded")
    for action in (load, unload, listing):
        action.add_argument("--worker", required=True, help="worker HOST:PORT")
        action.add_argument("--role", choices=("decode", "prefill"), default="decode", help="its role")
        action.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
        action.add_argument("--json", action="store_true", help="print one JSON object")
        add_cluster_secret_flag(action, "sent with the call, for a worker that requires it")
        add_internal_tls_flags(action, "to a worker serving internal mutual TLS")
        action.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    stub_class = (
        workers_pb2_grpc.DecodeWorkerStub if args.role == "decode" else workers_pb2_grpc.PrefillWorkerStub
    )
    secret = read_cluster_secret(args.cluster_secret_file) if args.cluster_secret_file else ""
    tls = internal_tls(args.internal_tls_cert, args.internal_tls_key, args.internal_tls_ca)
    with insecure_or_internal_channel(args.worker, tls) as channel:
        stub = stub_class(with_cluster_secret(channel, secret))
        try:
            if args.action == "load":
                reply = stub.LoadAdapter(
                    workers_pb2.LoadAdapterRequest(name=args.name, path=args.path), timeout=args.timeout
                )
            elif args.action == "unload":
                reply = stub.UnloadAdapter(
                    workers_pb2.UnloadAdapterRequest(name=args.name), timeout=args.timeout
                )
            else:
                reply = stub.ListAdapters(workers_pb2.ListAdaptersRequest(), timeout=args.timeout)
        except grpc.RpcError as error:
            print(f"baton adapters {args.action}: {error.code().name}: {error.details()}")
            return 1
    adapters = [
        {"name": a.name, "path": a.path, "digest": a.digest, "modules": a.modules} for a in reply.adapters
    ]
    if args.json:
        print(json.dumps({"adapters": adapters}))
    else:
        for a in adapters:
            print(f"{a['name']}\t{a['path']}\t{a['digest']}\t{a['modules']} modules")
    return 0
