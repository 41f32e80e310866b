import pytest


@pytest.fixture(params=["float16", "bfloat16"])
def dtype(request):
    return request.param
