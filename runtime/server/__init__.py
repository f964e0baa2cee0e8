"""The HTTP server: SGLang's native /generate protocol and the OpenAI API over one Engine."""
