"""`nextok lsp`: a stdio language server that asks a nextok server for completions.

    textDocument/inlineCompletion (LSP 3.18 ghost text)  --\
    textDocument/completion (one item: the completion)    --+-> POST /v1/code/complete
                                                               prefix/suffix windows around the
                                                               cursor, language id, file path,
                                                               the document's session_id

Cancellation, mapped onto what the nextok server really supports:

- `$/cancelRequest` makes pygls cancel the handler's asyncio task. The task is awaiting the HTTP
  response, so httpx closes that connection mid-response; the server watches every
  non-streaming /v1/code/complete for a client disconnect (`run_unless_disconnected`) and aborts
  the generation at once (logged as status 499, finish reason "abort"), freeing its KV blocks.
  The client gets the LSP RequestCancelled error (-32800).
- Every request of a document carries the same `session_id`, so when an editor sends a newer
  request without cancelling the older one (a keystroke), the server cancels the older
  generation itself; that older request then answers finish_reason "cancelled", which this
  server turns into an empty result (stale text is never shown).

Errors never stop the server: an unreachable nextok server or an error response (4xx/5xx, with
the server's OpenAI-style message) becomes an LSP error response (RequestFailed, -32803) and a
`window/showMessage`, shown once until the next success so a typing user is not flooded.
"""
from __future__ import annotations

import logging

from lsprotocol import types
from pygls import uris
from pygls.exceptions import JsonRpcException
from pygls.lsp.server import LanguageServer

from nextok import __version__
from nextok.lsp.backend import Backend, BackendConfig, BackendError

logger = logging.getLogger(__name__)
REQUEST_FAILED = -32803  # LSP ErrorCodes.RequestFailed: the request was valid but failed


class NextokLanguageServer(LanguageServer):
    def __init__(self, backend: Backend):
        super().__init__("nextok-lsp", __version__)
        self.backend = backend
        self._shown_error: str | None = None

    def report_failure(self, error: BackendError) -> JsonRpcException:
        """Shows the error once (until a success) and returns the LSP error to answer with."""
        message = str(error)
        logger.warning("%s", message)
        if message != self._shown_error:
            self._shown_error = message
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error,
                                                             message=f"nextok: {message}"))
        return JsonRpcException(message=message, code=REQUEST_FAILED)

    async def complete_at(self, uri: str, position: types.Position) -> str:
        """The completion text at `position` of the document ("" when superseded)."""
        doc = self.workspace.get_text_document(uri)
        source = doc.source
        offset = doc.offset_at_position(position)
        filepath = uris.to_fs_path(uri) if uri.startswith("file:") else uri
        try:
            out = await self.backend.complete(source, offset, doc.language_id or "", filepath,
                                              self.backend.session_id(uri))
        except BackendError as e:
            raise self.report_failure(e) from None
        self._shown_error = None
        if out.get("finish_reason") == "cancelled":
            return ""  # a newer request of this document superseded this one on the server
        return out.get("completion") or ""


def build_server(config: BackendConfig) -> NextokLanguageServer:
    ls = NextokLanguageServer(Backend(config))

    @ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: NextokLanguageServer, params: types.InlineCompletionParams):
        text = await ls.complete_at(params.text_document.uri, params.position)
        if not text:
            return types.InlineCompletionList(items=[])
        at = types.Range(start=params.position, end=params.position)
        return types.InlineCompletionList(items=[types.InlineCompletionItem(insert_text=text, range=at)])

    @ls.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
    async def completion(ls: NextokLanguageServer, params: types.CompletionParams):
        """For clients without inline completion: one item inserting the text at the cursor (an
        empty edit range, so the client has no typed word to filter it against)."""
        text = await ls.complete_at(params.text_document.uri, params.position)
        if not text:
            return types.CompletionList(is_incomplete=True, items=[])
        at = types.Range(start=params.position, end=params.position)
        first = text.strip().split("\n", 1)[0]
        item = types.CompletionItem(
            label=first[:60] or text, kind=types.CompletionItemKind.Text, detail="nextok",
            documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=text),
            filter_text=text, sort_text="0", text_edit=types.TextEdit(range=at, new_text=text),
            insert_text_format=types.InsertTextFormat.PlainText)
        # is_incomplete: the next keystroke asks again instead of filtering this stale item
        return types.CompletionList(is_incomplete=True, items=[item])

    @ls.feature(types.SHUTDOWN)
    async def shutdown(ls: NextokLanguageServer, params):
        await ls.backend.aclose()

    return ls


def _not_a_reported_failure(record: logging.LogRecord) -> bool:
    """pygls logs a traceback for every error response; a failure already reported (one
    warning line above) is expected, not a bug, so its traceback is dropped."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, JsonRpcException) and exc.code == REQUEST_FAILED)


def run(config: BackendConfig) -> int:
    logging.getLogger("pygls.protocol.json_rpc").addFilter(_not_a_reported_failure)
    build_server(config).start_io()
    return 0
