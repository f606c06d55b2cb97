#!/usr/bin/env bash
# Mermaid's script, served by the docs site itself: mkdocs-material draws ```mermaid blocks
# in the reader's browser and, unless the page has already loaded Mermaid (docs/mkdocs.yml
# lists this file in extra_javascript), fetches it from a CDN, which a machine without the
# internet (CI's) cannot reach. The file is Mermaid's own build from its npm package, at a
# pinned version of the major release material is written for, checked by its SHA-256; it
# is not kept in git (3.5 MB of minified code), and the site falls back to the CDN without it.
#
# Usage: docs/mermaid.sh   (needs npm; does nothing when the file is already in place)
set -euo pipefail
cd "$(dirname "$0")/.."

version=11.17.2
sha256=581ed7d74bd9048d0e3a91363927d72ef22942d7722546b27f7cc29e35390eb8
dest=docs/pages/assets/javascripts/mermaid.min.js

if [ -f "$dest" ] && echo "$sha256  $dest" | sha256sum --check --status; then
    exit 0
fi
if ! command -v npm >/dev/null; then
    echo "docs/mermaid.sh: npm is needed to fetch Mermaid $version (apt-get install npm)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# npm checks the tarball against the registry's integrity hash; the SHA-256 below pins the
# file itself, so a republished version cannot change what the site serves.
(cd "$tmp" && npm pack --silent "mermaid@$version" >/dev/null)
tar -xzf "$tmp/mermaid-$version.tgz" -C "$tmp" package/dist/mermaid.min.js
if ! echo "$sha256  $tmp/package/dist/mermaid.min.js" | sha256sum --check --status; then
    echo "docs/mermaid.sh: mermaid@$version's dist/mermaid.min.js is not the file pinned" >&2
    exit 1
fi
mkdir -p "$(dirname "$dest")"
mv "$tmp/package/dist/mermaid.min.js" "$dest"
echo "docs/mermaid.sh: Mermaid $version in $dest"
