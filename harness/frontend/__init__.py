"""The API-server process: HTTP in, EngineCoreRequest out through the codec, outputs back as SSE.

app            routes, middleware, the one engine-error → HTTP table, the app factory
protocol       OpenAI request parsing and the error body shape
inputs         request → EngineCoreRequest (tokenize, images, context checks)
images         image data URLs → PIL images or pixel tensors for the engine
outputs        engine outputs → text (detokenize, stop strings) → chunks and responses
engine_client  the EngineClient interface and the ZeroMQ client (codec encode/decode)
settings       FrontendSettings
metrics        the frontend's /metrics counters
"""
