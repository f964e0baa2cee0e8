"""The radix tree of token prefixes -> KV slot ids (RadixAttention, arXiv 2312.07104 sec. 3).

Pure Python, standard library only. See RadixTree for the scheduler protocol and accounting.
"""

from .node import InsertResult, MatchResult, RadixNode
from .tree import RadixTree

__all__ = ["InsertResult", "MatchResult", "RadixNode", "RadixTree"]
