# Sourced by the device scripts: unpacks the binaries of .gpu2/ (gzip from scripts/gpu-pack,
# or xz where a call's carry limit asked for it; python's lzma where xz is absent) and sets
# the cache and output folders.
export SPECC_CACHE_DIR=/tmp/specc-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
find .gpu2 -name "*.gz" -exec gunzip -kf {} \;
for f in .gpu2/*.xz; do
  [[ -e $f ]] && python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"))' "$f"
done
chmod +x .gpu2/tests/* .gpu2/specc .gpu2/specc_base 2>/dev/null
true
