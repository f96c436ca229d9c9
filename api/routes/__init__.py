"""The HTTP API's routes.

A key is any UTF-8 text, a line break included, and sits in the path as ``{key:path}``:
Starlette's path convertor matches ``.*``, which stops at a line break, so a key holding
one found no route (404) where any other key is read. It is registered again here, before
any route is made, to match every character.
"""

from typing import Any

from starlette.convertors import Convertor, register_url_convertor


class _AnyPath(Convertor[str]):
    regex = "[\\s\\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: Any) -> str:
        return str(value)


register_url_convertor("path", _AnyPath())
