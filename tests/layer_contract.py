"""lvfl's layer contract (docs/design.md, "The layers"), checked on the import graph grimp builds from the source.

Each container's children stand on layers, top first; a module may import only from the layers below its own, and
the names that share a layer may not import each other. Every import counts, one written inside a function too:
grimp reads every import statement of a module, and a lazy import still says where the code stands. A container's
child that is on no layer is refused as well, so a new package is placed on purpose.

`python tests/layer_contract.py` prints one line per import up a layer and exits 1 (`make lint`); the test suite
runs the same check (tests/test_layers.py), and runs it on a copy of the package given a deliberately wrong import.
"""

from __future__ import annotations

import sys

import grimp

#: container -> its layers, top first; a set is one layer of names that do not import each other
LAYERS: dict[str, list[set[str]]] = {
    "lvfl": [
        {"__main__"},
        {"commands"},
        {"serving"},
        {"callbacks", "export"},
        {"inference", "attacks"},
        {"protocols"},
        {"datamodules", "compression"},
        {"privacy", "models", "alignment"},
        {"federation", "observing", "checkpoints", "runs"},
        {"wire", "network", "loggers", "messages", "checks", "parties", "progress", "prediction_rows", "text_files"},
        {"shadows", "crypto", "schedule", "moved_modules", "ledger"},
    ],
    "lvfl.privacy": [
        {"aggregation", "soft_labels", "defenses", "oblivious_transfer"},
        {"labels"},
    ],
    "lvfl.alignment": [
        {"setup_exchange"},
        {"intersection"},
        {"ecdh", "kkrt"},
        {"matching"},
        {"parts"},
    ],
    "lvfl.commands": [
        {"warm_party"},
        {"entry"},
        {"export", "launch", "bench", "pki", "serve", "score", "attack_score", "early_checks"},
        {"rehearse"},
        {"launch_parties"},
        {"party"},
        {"fit"},
        {"predict", "console", "twin", "config_files", "interrupts", "lead_help", "warm_start"},
        {"errors"},
        {"argument_errors"},
    ],
    "lvfl.serving": [
        {"api", "http_endpoint", "client"},
        {"scorer"},
        {"contributions"},
        {"feature_source", "membership", "metrics", "oblivious", "answer_checks", "readiness"},
        {"export_folder", "service"},
        {"serving_pb2"},
    ],
    "lvfl.federation": [
        {"rehearsal", "link_proxy"},
        {"link"},
        {"transport"},
        {"inbox", "outbox"},
        {"endpoint"},
        {"addresses", "identity", "channels"},
        {"federation_file"},
        {"pki"},
        {"codec"},
        {"wire_form", "expectations"},
        {"envelope_schema", "envelope_pb2"},
    ],
}


def _tail(module: str, container: str) -> str:
    return module[len(container) + 1 :].split(".")[0]


def violations(package: str = "lvfl") -> list[str]:
    """One line per import that breaks `LAYERS`, and per child of a container that stands on no layer (none: it holds).

    An import up a layer reads ``lvfl/wire.py:350: from lvfl.commands.fit import build_cli: lvfl.wire ->
    lvfl.commands.fit (wire stands below commands in lvfl)``; an import through other modules names the whole chain.
    """
    graph = grimp.build_graph(package)
    found: list[str] = []
    for container, layers in LAYERS.items():
        named = {name for layer in layers for name in layer}
        children = {_tail(child, container) for child in graph.find_children(container)}
        found += [f"{container}.{child} stands on no layer of {container}" for child in sorted(children - named)]
        on_layer = {name: index for index, layer in enumerate(layers) for name in layer}
        dependencies = graph.find_illegal_dependencies_for_layers(
            layers=[grimp.Layer(*sorted(layer), independent=True) for layer in layers],
            containers={container},
        )
        for dependency in sorted(dependencies, key=lambda d: (d.importer, d.imported)):
            for route in dependency.routes:
                for head in sorted(route.heads):
                    for tail in sorted(route.tails):
                        chain = [head, *route.middle, tail]
                        low, high = (_tail(d, container) for d in (dependency.importer, dependency.imported))
                        why = (
                            f"{low} and {high} share a layer of {container}"
                            if on_layer[low] == on_layer[high]
                            else f"{low} stands below {high} in {container}"
                        )
                        found.append(f"{_where(graph, chain[0], chain[1])}: {' -> '.join(chain)} ({why})")
    return found


def _where(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    details = graph.get_import_details(importer=importer, imported=imported)
    if not details:
        return importer
    first = details[0]
    return f"{importer.replace('.', '/')}.py:{first['line_number']}: {first['line_contents']}"


if __name__ == "__main__":
    broken = violations()
    print("\n".join(broken) or "lvfl's layer contract holds")
    sys.exit(1 if broken else 0)
