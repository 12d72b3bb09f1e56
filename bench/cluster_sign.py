"""What one signed internal request costs its two ends: ``Signer.headers`` plus
``Verifier.verify`` of a fetch-sized query (HMAC-SHA256, nonce bookkeeping), best of 5.

    .venv/bin/python bench/cluster_sign.py [--n 20000]

Runs on older trees too (without the receiver binding of issue 31 it signs for nobody), so
the same command before and after a change compares them. Not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import inspect
import timeit

from nsqx.cluster.trust import Signer, Verifier

SECRET = b"0123456789abcdef0123456789abcdef"
QUERY = {"topic": "t", "partition": "0", "epoch": "3", "node": "n1", "offset": "10",
         "wait_ms": "500"}
ME = "127.0.0.1:4153"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    n = ap.parse_args().n
    bound = "to" in inspect.signature(Signer.headers).parameters
    signer = Signer(SECRET, "n1")
    verifier = Verifier(SECRET, receivers=[ME]) if bound else Verifier(SECRET)
    sign_kw = {"to": ME} if bound else {}

    def one() -> None:
        h = signer.headers("GET", "/nsqx/replica/fetch", QUERY, **sign_kw)
        verifier.verify("GET", "/nsqx/replica/fetch", QUERY.items(), b"", h)

    best = min(timeit.repeat(one, number=n, repeat=5)) / n
    print(f"sign + verify: {best * 1e6:.1f} us per request "
          f"({'receiver-bound' if bound else 'unbound'} signatures)")


if __name__ == "__main__":
    main()
