"""`specgen datastore build`: a retrieval datastore for `rest` (suffix array) or `dresd` (dense ANN index) from a
corpus folder, tokenised with a model's tokenizer; resumable, with a progress bar and a size/time report."""

from __future__ import annotations

import argparse
import json
import sys


def add_datastore_parser(commands, command) -> None:
    datastore = command(commands, "datastore", "build retrieval datastores for the model-free drafters rest and dresd",
                        "datastore", handler=_missing_action)
    actions = datastore.add_subparsers(dest="action", metavar="ACTION")
    build = actions.add_parser("build", help="tokenise a corpus and index it (resumes an interrupted build)",
                               description="Tokenise every text file under --corpus with the model's tokenizer and "
                               "write a datastore folder: a suffix array (rest), plus context embeddings behind a "
                               "faiss index (dresd). Load it with --datastore PATH.", allow_abbrev=False)
    build.set_defaults(handler=_build, full_name="datastore build")
    build.add_argument("--kind", required=True, choices=("rest", "dresd"), help="rest (sparse) or dresd (dense)")
    build.add_argument("--corpus", required=True, metavar="DIR", help="a folder of text files (or one file)")
    build.add_argument("--model", default=None, metavar="M", help="the model whose tokenizer (and, for dresd, "
                       "embedder) the datastore is for (default: the default text model)")
    build.add_argument("--draft", default=None, metavar="D", help="dresd: embed with this draft model's hidden "
                       "states (default: the model's shipped draft, else the model itself)")
    build.add_argument("--out", required=True, metavar="PATH", help="the datastore folder to write")
    build.add_argument("--max-tokens", type=int, default=None, metavar="N", help="index at most N corpus tokens")
    build.add_argument("--dense-keys", type=int, default=None, metavar="N", help="dresd: embed at most N contexts, "
                       "spread evenly over the corpus (default: 300000)")
    build.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")


def _missing_action(args: argparse.Namespace) -> int:
    from specgen.errors import InvalidRequest

    raise InvalidRequest("choose an action: specgen datastore build --kind rest|dresd --corpus DIR --out PATH")


def _build(args: argparse.Namespace) -> int:
    from specgen.modalities.text import datastore
    from specgen.modalities.text.generator import TextGenerator

    generator = TextGenerator(args.model, args.draft, threads=args.threads)
    embedder = None
    if args.kind == "dresd":
        from specgen.modalities.drafters.dense import embedder_for

        embedder = embedder_for(generator)
    report = datastore.build(args.kind, args.corpus, args.out, generator.tokenizer, model=generator.model_path,
                             embedder=embedder, max_tokens=args.max_tokens, dense_keys=args.dense_keys)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}", file=sys.stdout)
    return 0
