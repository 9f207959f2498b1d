"""The model ladder: Qwen2.5 and Qwen2.5-Coder instruct models, 0.5B to 7B, Q4_K_M GGUF, on the Hugging Face hub.

Every entry pins the publisher's own GGUF repository (``Qwen/...-GGUF``) at a commit, with each file's
size in bytes and SHA-256. None of these files was downloaded on the machine that wrote this table
(it has no route to the hub): the pins were read from public code and documents that quote them
(download scripts, model catalogues, benchmark write-ups found by their content in a public code
index), and an entry was kept only when at least two independent files agreed on its numbers. A pin
that turns out wrong fails safely: the download is checked against the pinned SHA-256 and against the
one the hub reports, and nothing is cached on a mismatch.

``Qwen2.5-7B-Instruct-GGUF`` publishes its Q4_K_M only split in two parts; the other seven are one
file each. The 3B models are under the Qwen Research license (non-commercial), the rest Apache-2.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.backends.hub import HubFile, HubSource

__all__ = ["LADDER", "LadderModel"]


@dataclass(frozen=True)
class LadderModel:
    """One named model of the ladder.

    Attributes:
        name: the alias used in specs (``embedded:NAME``) and ``harness models pull NAME``.
        source: the pinned repository, commit and files.
        license: the model's license.
        description: one line for ``harness models list``.
    """

    name: str
    source: HubSource
    license: str
    description: str


def _one(repo: str, commit: str, path: str, size: int, sha256: str) -> HubSource:
    return HubSource(repo=repo, revision=commit, files=(HubFile(path, size, sha256),))


LADDER: tuple[LadderModel, ...] = (
    LadderModel(
        "qwen2.5-0.5b-instruct",
        # pin quoted by a model-tooling script (repo, commit, file, sha256) and a dictation app's catalogue
        # (commit, size, sha256); size and sha256 also by three more catalogues
        _one(
            "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "9217f5db79a29953eb74d5343926648285ec7e67",
            "qwen2.5-0.5b-instruct-q4_k_m.gguf",
            491_400_032,
            "74a4da8c9fdbcd15bd1f6d01d621410d31c6fc00986f5eb687824e7b93d7a9db",
        ),
        "Apache-2.0",
        "Qwen2.5-0.5B-Instruct, Q4_K_M GGUF (0.5 GB)",
    ),
    LadderModel(
        "qwen2.5-1.5b-instruct",
        # pin quoted by a Rust GGUF downloader (commit, size, sha256) and the same model-tooling script
        # (commit, sha256); size and sha256 also by a desktop app's catalogue
        _one(
            "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
            "91cad51170dc346986eccefdc2dd33a9da36ead9",
            "qwen2.5-1.5b-instruct-q4_k_m.gguf",
            1_117_320_736,
            "6a1a2eb6d15622bf3c96857206351ba97e1af16c30d7a74ee38970e434e9407e",
        ),
        "Apache-2.0",
        "Qwen2.5-1.5B-Instruct, Q4_K_M GGUF (1.1 GB)",
    ),
    LadderModel(
        "qwen2.5-3b-instruct",
        # pin quoted by the Rust GGUF downloader (commit, size, sha256), a classifier launcher script (commit,
        # sha256) and an experiment write-up (commit, sha256); size also by a desktop app's catalogue
        _one(
            "Qwen/Qwen2.5-3B-Instruct-GGUF",
            "7dabda4d13d513e3e842b20f0d435c732f172cbe",
            "qwen2.5-3b-instruct-q4_k_m.gguf",
            2_104_932_768,
            "626b4a6678b86442240e33df819e00132d3ba7dddfe1cdc4fbb18e0a9615c62d",
        ),
        "Qwen-Research",
        "Qwen2.5-3B-Instruct, Q4_K_M GGUF (2.1 GB; research license)",
    ),
    LadderModel(
        "qwen2.5-7b-instruct",
        # pin quoted by the classifier launcher script, a model-download helper and a Node app (commit, both
        # parts' sha256); part sizes by a Swift test and two verification notes that compare with the hub's lfs.oid
        HubSource(
            repo="Qwen/Qwen2.5-7B-Instruct-GGUF",
            revision="bb5d59e06d9551d752d08b292a50eb208b07ab1f",
            files=(
                HubFile(
                    "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
                    3_993_201_344,
                    "dfce12e3862a5283ccfb88221b48480e58745165de856439950d0f22590580db",
                ),
                HubFile(
                    "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf",
                    689_872_288,
                    "539cf93f78e887edea1c04e2d7d8cdaca9d01dae9c9025bcb8accbe29df3d72a",
                ),
            ),
        ),
        "Apache-2.0",
        "Qwen2.5-7B-Instruct, Q4_K_M GGUF in 2 parts (4.7 GB)",
    ),
    LadderModel(
        "qwen2.5-coder-0.5b-instruct",
        # pin quoted by a Spanish catalogue script and a Dockerfile (commit, sha256, size) and a Rust model
        # list (commit, size, sha256); size and sha256 also by two more catalogues
        _one(
            "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            "ebb2015119c907b064c512bf053e945850b5875f",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        "Apache-2.0",
        "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (0.5 GB)",
    ),
    LadderModel(
        "qwen2.5-coder-1.5b-instruct",
        # pin quoted by a TypeScript model catalogue, the Spanish catalogue script, the Rust model list and a
        # Kotlin app (commit, size, sha256); size and sha256 also by four more files
        _one(
            "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            "f86cb2c1fa58255f8052cc32aeede1b7482d4361",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        "Apache-2.0",
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1.1 GB)",
    ),
    LadderModel(
        "qwen2.5-coder-3b-instruct",
        # pin quoted by the TypeScript model catalogue and a Swift test (commit, size, sha256); size and sha256
        # also by a Python manifest test and a Rust asset list
        _one(
            "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF",
            "f74adce6aa16316c625447af059dbebe4983757c",
            "qwen2.5-coder-3b-instruct-q4_k_m.gguf",
            2_104_932_800,
            "724fb256bec1ff062b2f65e4569e871ad2e95ab2a3989723d1769c54294730b7",
        ),
        "Qwen-Research",
        "Qwen2.5-Coder-3B-Instruct, Q4_K_M GGUF (2.1 GB; research license)",
    ),
    LadderModel(
        "qwen2.5-coder-7b-instruct",
        # pin quoted by the TypeScript model catalogue (commit, size, sha256) and an integration decision record
        # (the commit's short form, sha256);
        # size and sha256 also by a Rust catalogue, a benchmark note and a data-audit table. The repository also
        # holds a split copy of this file; the single file is the one pinned here.
        _one(
            "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF",
            "13fb94bfda8c8cf22497dc57b78f391a9acb426a",
            "qwen2.5-coder-7b-instruct-q4_k_m.gguf",
            4_683_073_536,
            "509287f78cb4d4cf6b3843734733b914b2c158e43e22a7f4bf5e963800894d3c",
        ),
        "Apache-2.0",
        "Qwen2.5-Coder-7B-Instruct, Q4_K_M GGUF (4.7 GB)",
    ),
)
"""The ladder in size order, instruct models first."""
