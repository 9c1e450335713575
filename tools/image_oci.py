"""Each built image's figures, and the OCI manifest list that names them by platform.

skopeo copies each architecture's image out of the engine into a staging OCI layout (layers gzip
compressed, as a registry serves them); buildah makes a manifest list of them, which records each entry's
platform from the image's own config, and pushes it with every image into the output layout as one tag.
The result is read back with skopeo: an OCI image index whose entries name linux/amd64 and linux/arm64,
each entry's layers the very filesystem the engine built (the config's diff IDs), so that the image the
smoke run starts is the one a node of that architecture pulls. From the layout, ``skopeo copy --all
oci:<layout>:<tag> docker://<registry>/gpu-exporter:<version>`` publishes it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from image_engine import Engine, StepError, log, run

__all__ = ["assemble", "describe"]

INDEX = "application/vnd.oci.image.index.v1+json"


def describe(engine: Engine, tag: str, base_tag: str) -> dict[str, object]:
    """Size as the engine counts it (uncompressed), filesystem layers, and the history."""
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", tag).strip())
    history = engine.docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", tag)
    layers = []
    for line in history.splitlines():
        human, _, created_by = line.partition("\t")
        layers.append({"size": human, "created_by": " ".join(created_by.split())[:160]})
    base = int(engine.docker("image", "inspect", "--format", "{{.Size}}", base_tag).strip())
    rootfs = json.loads(engine.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", tag))
    return {"size_bytes": size, "base_size_bytes": base, "filesystem_layers": len(rootfs), "history": layers}


def _ref(tag: str) -> str:
    """An OCI layout's reference name for an image tag (gpu-exporter:dev-arm64 -> dev-arm64)."""
    return tag.rsplit(":", 1)[-1] if ":" in tag else "latest"


class _Buildah:
    """buildah with its storage in the work folder, so that no other store on the machine is touched."""

    def __init__(self, folder: Path) -> None:
        self.options = [f"--root={folder / 'root'}", f"--runroot={folder / 'run'}", "--storage-driver=vfs"]

    def __call__(self, *args: str) -> str:
        return run(["buildah", *self.options, *args], timeout=1800)


def assemble(engine: Engine, tag: str, images: dict[str, str], layout: Path) -> dict[str, object]:
    """The manifest list ``tag`` of ``images`` (architecture -> engine tag) in the OCI layout ``layout``;
    what it holds, read back."""
    staging = layout.parent / (layout.name + "-staging")
    for folder in (staging, layout):
        shutil.rmtree(folder, ignore_errors=True)
    daemon = f"unix://{engine.sock}"
    for image in images.values():
        log(f"skopeo: {image} -> oci:{staging}:{_ref(image)}")
        run(
            [
                "skopeo",
                "copy",
                "--quiet",
                f"--src-daemon-host={daemon}",
                "--dest-compress",
                "--dest-compress-format=gzip",
                f"docker-daemon:{image}",
                f"oci:{staging}:{_ref(image)}",
            ],
            timeout=1800,
        )
    buildah = _Buildah(layout.parent / "buildah")
    name = f"localhost/{tag}"
    try:
        buildah("manifest", "rm", name)
    except StepError:
        pass  # none from an earlier run
    buildah("manifest", "create", name)
    for image in images.values():
        buildah("manifest", "add", name, f"oci:{staging}:{_ref(image)}")
    log(f"buildah: manifest list {tag} -> oci:{layout}:{_ref(tag)}")
    buildah("manifest", "push", "--all", "--format=oci", name, f"oci:{layout}:{_ref(tag)}")
    shutil.rmtree(staging, ignore_errors=True)
    return read_back(engine, layout, tag, images)


def _blob(layout: Path, digest: str) -> Any:
    algorithm, _, hexdigest = digest.partition(":")
    return json.loads((layout / "blobs" / algorithm / hexdigest).read_text())


def read_back(engine: Engine, layout: Path, tag: str, images: dict[str, str]) -> dict[str, object]:
    """The index as skopeo reads it; StepError unless it names each architecture once, with the very
    layers the engine built for it."""
    ref = f"oci:{layout}:{_ref(tag)}"
    index = json.loads(run(["skopeo", "inspect", "--raw", ref]))
    if index.get("mediaType") != INDEX:
        raise StepError(f"{ref} is {index.get('mediaType')}, not an OCI image index")
    platforms = [f"{m['platform']['os']}/{m['platform']['architecture']}" for m in index.get("manifests", [])]
    expected = sorted(f"linux/{arch}" for arch in images)
    if sorted(platforms) != expected:
        raise StepError(f"{ref} names {platforms}, not {expected}")
    entries: dict[str, object] = {}
    for arch, image in images.items():
        # as a node of that architecture picks its entry
        chosen = json.loads(run(["skopeo", "--override-os=linux", f"--override-arch={arch}", "inspect", ref]))
        digest = next(m["digest"] for m in index["manifests"] if m["platform"]["architecture"] == arch)
        manifest = _blob(layout, digest)
        config = _blob(layout, manifest["config"]["digest"])
        built = json.loads(engine.docker("image", "inspect", "--format", "{{json .RootFS.Layers}}", image))
        layers = [layer["digest"] for layer in manifest["layers"]]
        if chosen.get("Architecture") != arch or chosen.get("Layers") != layers:
            raise StepError(f"skopeo picks {chosen.get('Architecture')} {chosen.get('Layers')} for linux/{arch}")
        if config.get("architecture") != arch or config.get("rootfs", {}).get("diff_ids") != built:
            raise StepError(f"{ref}'s linux/{arch} entry is not the filesystem built as {image}")
        entries[arch] = {
            "manifest_digest": digest,
            "compressed_bytes": sum(int(layer["size"]) for layer in manifest["layers"]),
            "layers": len(manifest["layers"]),
        }
    log(f"{ref}: OCI image index of {', '.join(platforms)}")
    return {"layout": str(layout), "reference": _ref(tag), "media_type": index["mediaType"], "platforms": entries}
