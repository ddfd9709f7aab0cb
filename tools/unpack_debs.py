#!/usr/bin/env python3
"""Unpacks Debian packages into a prefix, with nothing but Python: `unpack_debs.py DIR PREFIX`.

A bare GPU machine has no Debian tools and no network. `./course gpu-deps` fetches the .deb files
the build needs (header-only Eigen and nlohmann-json, GoogleTest's source) into .deb/ on a
machine that has them; this script unpacks each one's data archive under PREFIX, as `dpkg -x`
would, so that CMake finds PREFIX/usr/share/eigen3/cmake and the rest.
"""
import io
import os
import sys
import tarfile


def members(path):
    """(name, bytes) of each member of an ar archive (a .deb is one)."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise SystemExit(f"{path}: not a Debian package (no ar header)")
        while True:
            header = f.read(60)
            if len(header) < 60:
                return
            name = header[:16].decode().strip().rstrip("/")
            size = int(header[48:58].decode().strip())
            data = f.read(size)
            if size % 2:
                f.read(1)
            yield name, data


def unpack(deb, prefix):
    for name, data in members(deb):
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise SystemExit(f"{deb}: zstd-compressed data; unpack it with dpkg -x instead")
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                safe = [m for m in tar.getmembers()
                        if not os.path.isabs(m.name) and ".." not in m.name.split("/")]
                tar.extractall(prefix, members=safe)
            return
    raise SystemExit(f"{deb}: no data archive inside")


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: unpack_debs.py DIR_OF_DEBS PREFIX")
    src, prefix = sys.argv[1], sys.argv[2]
    debs = sorted(f for f in os.listdir(src) if f.endswith(".deb"))
    if not debs:
        raise SystemExit(f"no .deb files in {src}: run ./course gpu-deps on a machine with apt first")
    os.makedirs(prefix, exist_ok=True)
    for d in debs:
        unpack(os.path.join(src, d), prefix)
        print(f"unpacked {d}")


if __name__ == "__main__":
    main()
