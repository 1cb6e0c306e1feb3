"""msgspec Structs for every request and response of the HTTP API.

Request Structs ignore unknown fields (clients send extras); decoders and encoders are built once
at import. Response Structs mirror the OpenAI and Anthropic wire formats field for field.
"""
