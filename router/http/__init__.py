"""The router's HTTP room: the API clients call (OpenAI and SGLang-native routes, the hot path served
from uvicorn's protocol, admin and auth), the request bodies and their validation, and the output
formats (chat output, tools, reasoning, logprobs, n > 1 choices). It hands each request to
`router.dispatch`."""
