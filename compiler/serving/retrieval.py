"""Retrieval over HTTP: OpenAI's POST /v1/embeddings and the Jina/Cohere-shaped POST /v1/rerank
(also /rerank) that llama-server serves, for a model whose steps return hidden states (an
encoder, or a decoder served with --embedding).

Every field is bounded and a bad one is a 400 naming it; the inputs are tokenized in the thread
pool and go to the engine, which packs the inputs of every request waiting into shared steps
(Engine.embed). Pooling and normalization are runtime/embedding.py's, the same as Model.embed's,
so a text's vector over HTTP is the one the Python API gives, bit for bit.
"""
from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Literal, Union

import numpy as np
from fastapi import FastAPI, Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from ..runtime.embedding import MAX_NORM, ClassHead, Pooling, default_pooling, rerank_ids, vectors
from .engine import Engine
from .http import ApiError, ServerConfig, admitted_body, busy, model_not_found
from .types import QueueFull

MAX_INPUTS = 2048  # inputs of one request (OpenAI's bound)
MAX_REQUEST_TOKENS = 300_000  # tokens of one request's inputs together (OpenAI's bound)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


Ids = Annotated[list[StrictInt], Field(min_length=1)]


class EmbeddingRequest(_Strict):
    model: StrictStr
    input: Union[StrictStr, Annotated[list[StrictStr], Field(min_length=1, max_length=MAX_INPUTS)], Ids,
                 Annotated[list[Ids], Field(min_length=1, max_length=MAX_INPUTS)]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None
    embd_normalize: Annotated[StrictInt, Field(ge=-1, le=MAX_NORM)] = 2  # llama-server's: -1 none, 2 L2, p
    user: StrictStr | None = None


class RerankRequest(_Strict):
    model: StrictStr | None = None
    query: Annotated[StrictStr, Field(min_length=1)]
    documents: Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1, max_length=MAX_INPUTS)]
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool = False


def add_retrieval_routes(app: FastAPI, engine: Engine, config: ServerConfig) -> None:
    model, name = engine.model, config.model_name
    pooling = default_pooling(model) if model.embedding else None
    head: list[ClassHead] = []  # a reranker's, read on first use

    async def admitted(request: HttpRequest, cls, named: bool):
        req = await admitted_body(request, config, engine.has_room, cls)
        if (named or req.model is not None) and req.model != name:
            raise model_not_found(req.model, name)
        if not model.embedding:
            raise ApiError(400, f"model '{name}' is served for generation; start kiln serve with --embedding "
                                "(or serve an embedding model) for this route", param="model")
        return req

    def checked(inputs: list[list[int]], field: str) -> list[list[int]]:
        total = 0
        for k, ids in enumerate(inputs):
            if not ids:
                raise ApiError(400, f"{field}[{k}]: the input is empty", param=field)
            if len(ids) > model.n_ctx:
                raise ApiError(400, f"{field}[{k}]: {len(ids)} tokens, over the model's {model.n_ctx} (--ctx)",
                               param=field, code="context_length_exceeded")
            bad = next((t for t in ids if not 0 <= t < model.n_vocab), None)
            if bad is not None:
                raise ApiError(400, f"{field}[{k}]: token id {bad} is out of range [0, {model.n_vocab})", param=field)
            total += len(ids)
        if total > MAX_REQUEST_TOKENS:
            raise ApiError(400, f"{field}: {total:,} tokens in one request, over {MAX_REQUEST_TOKENS:,}", param=field)
        return inputs

    def token_lists(raw) -> list[list[int]]:
        if isinstance(raw, str) or (raw and isinstance(raw[0], str)):
            texts = [raw] if isinstance(raw, str) else raw
            for k, text in enumerate(texts):
                if not text:
                    raise ApiError(400, f"input[{k}]: the string is empty", param="input")
                if len(text) > model.n_ctx * 64:  # no tokenization of it could fit
                    raise ApiError(400, f"input[{k}]: {len(text):,} characters cannot fit in {model.n_ctx} tokens",
                                   param="input", code="context_length_exceeded")
            return [model.tokenize(t) for t in texts]
        return [raw] if isinstance(raw[0], int) else raw

    async def rows_of(inputs: list[list[int]], kind: str) -> list[np.ndarray]:
        try:
            done = engine.embed(inputs, kind)
        except QueueFull as e:
            raise busy(str(e)) from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(done), config.request_timeout)
        except asyncio.TimeoutError:
            raise ApiError(503, f"the request took longer than {config.request_timeout:g} s (--request-timeout)",
                           kind="server_error") from None

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings(request: HttpRequest):
        req = await admitted(request, EmbeddingRequest, named=True)
        if pooling in ("none", "rank"):
            raise ApiError(400, f"model '{name}' pools '{pooling}', which gives no one vector an input (OpenAI's "
                                "shape); its file's pooling_type decides", param="model")
        if req.dimensions is not None and req.dimensions > model.spec.hparams.n_embd:
            raise ApiError(400, f"dimensions: at most the model's {model.spec.hparams.n_embd}, got {req.dimensions}",
                           param="dimensions")
        inputs = checked(await run_in_threadpool(token_lists, req.input), "input")
        rows = await rows_of(inputs, pooling)
        vs = vectors(rows, Pooling(pooling, req.embd_normalize, req.dimensions), model.spec.hparams.causal,
                     model.projection)
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                 if req.encoding_format == "base64" else v.tolist()} for i, v in enumerate(vs)]
        n = sum(map(len, inputs))
        return {"object": "list", "data": data, "model": name, "usage": {"prompt_tokens": n, "total_tokens": n}}

    async def rerank(request: HttpRequest):
        req = await admitted(request, RerankRequest, named=False)
        if not head:
            try:
                head.append(ClassHead(model))
            except Exception as e:
                raise ApiError(400, str(e), param="model") from None
        inputs = checked(await run_in_threadpool(lambda: [rerank_ids(model, req.query, d) for d in req.documents]),
                         "documents")
        scores = head[0].scores(await rows_of(inputs, "rank"), model.spec.hparams.causal).tolist()
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n or len(scores)]
        results = [{"index": i, "relevance_score": scores[i]} | ({"document": {"text": req.documents[i]}}
                                                                 if req.return_documents else {}) for i in order]
        n = sum(map(len, inputs))
        return {"object": "list", "model": name, "results": results,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    for path in ("/v1/rerank", "/rerank", "/v1/reranking"):
        app.post(path)(rerank)
