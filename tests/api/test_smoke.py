from tests.helpers.api import Api


def test_enqueue_acquire_complete_round_trip(api: Api) -> None:
    item = api.enqueue(payload={"n": 1})
    (lease,) = api.acquire()
    assert lease["item_id"] == item["item_id"]
    done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"], result=1)
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "completed"
