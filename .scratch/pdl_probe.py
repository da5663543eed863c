import sys, json, tempfile
from pathlib import Path
sys.path.insert(0, ".")
from tests.compile.conftest import make_project, run_build
from builder.cubin import disassemble
CAT = """pipeline: sm90
targets: [sm_90a]
defaults:
  dtypes: {a: bf16, b: bf16, acc: f32, c: bf16}
  layout: tn
kernels:
  - tile: [128, 128, 64]
    cluster: [2, 1]
"""
def main():
    t = Path(tempfile.mkdtemp())
    r = run_build(make_project(t / "p", CAT), t / "a", t / "c", jobs=2)
    assert r.ok, [x.error for b in r.bundles for x in b.failed]
    b = r.bundles[0].path
    m = json.loads((b / "manifest.json").read_text())["kernels"][0]
    Path(".scratch/pdl.sass").write_text(disassemble((b / m["cubin"]["file"]).read_bytes()))
    print(b)

if __name__ == '__main__':
    main()
